"""Snapshots reach Spark's state store coordinator (issue 29).

From Spark 4.2 the coordinator judges a store "lagging" when the snapshot versions reported for it
trail the query by multiplierForMinVersionDiffToLog x minDeltasForSnapshot versions and
multiplierForMinTimeDiffToLog x the maintenance interval, and then (forceSnapshotUploadOnLag,
default true) passes forceSnapshotOnCommit to every commit of that store: a provider that never
reports turns every commit into a snapshot after a few minutes. The referees are the checkpoint's
own files (snapshots counted in the layout, not from our metrics) and the coordinator's record,
asked on the driver through Spark's own API.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from spark_support import start_session

pytestmark = [pytest.mark.spark, pytest.mark.cluster]
BATCHES = 16
MIN_DELTAS = 2


# Separate executor JVMs: the reports cross processes to the driver's coordinator, as in production
# (local[2] runs the same code in one JVM).
@pytest.fixture(scope="module", params=["local-cluster[2,1,1024]"])
def spark(request: pytest.FixtureRequest) -> Iterator[SparkSession]:
    # Spark's lag rule at these settings: 2 x 2 versions behind and 2 x 1 s (its multipliers are 5 and
    # 10 by default): a store that never reports is forced from about the 4th batch once 2 s have
    # passed, well inside the test's batches.
    session = start_session(
        request.param,
        **{
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.streaming.stateStore.maintenanceInterval": "1s",
            "spark.sql.streaming.stateStore.multiplierForMinVersionDiffToLog": "2",
            "spark.sql.streaming.stateStore.multiplierForMinTimeDiffToLog": "2",
            "spark.sql.streaming.stateStore.minDeltasForSnapshot": str(MIN_DELTAS),
            "spark.sql.streaming.minBatchesToRetain": str(BATCHES * 2),  # every snapshot stays countable
        },
    )
    yield session
    session.stop()


def snapshot_files(store: Path, commit_mode: str) -> int:
    """Snapshots in a store's directory, read from the layout: a changelog-mode snapshot is a
    snapshots/<version>-<id>.json file; in snapshot mode every version's manifest says it is one."""
    if commit_mode == "changelog":
        return len([p for p in (store / "snapshots").glob("*.json") if re.fullmatch(r"\d+-[0-9a-f-]+\.json", p.name)])
    return sum(
        1
        for p in (store / "manifests").glob("*.json")
        if re.fullmatch(r"\d+\.json", p.name) and json.loads(p.read_text()).get("kind") == "snapshot"
    )


def coordinator_snapshot_version(spark: SparkSession, state_dir: str, partition: int, run_id: str) -> int | None:
    """The newest snapshot version Spark's coordinator has recorded for a store of operator 0."""
    jvm = spark._jvm  # type: ignore[attr-defined]
    pkg = jvm.org.apache.spark.sql.execution.streaming.state
    store_id = pkg.StateStoreId(state_dir, 0, partition, "default")
    provider_id = pkg.StateStoreProviderId(store_id, jvm.java.util.UUID.fromString(run_id))
    coordinator = spark._jsparkSession.streams().stateStoreCoordinator()  # type: ignore[attr-defined]
    found = coordinator.getLatestSnapshotVersionForTesting(provider_id)
    return int(found.get()) if found.isDefined() else None


def write_batches(input_dir: Path, batches: int) -> None:
    """One small file per batch, over 20 keys."""
    input_dir.mkdir()
    for b in range(batches):
        f = input_dir / f"b{b:04d}.json"
        f.write_text("".join(json.dumps({"key": f"k{(b * 3 + i) % 20}", "value": i}) + "\n" for i in range(10)))
        os.utime(f, (1_700_000_000 + b, 1_700_000_000 + b))  # the file source orders files by mtime


def start_aggregation(spark: SparkSession, input_dir: Path, checkpoint: Path, sink: Any = None) -> StreamingQuery:
    """A sum per key, a file per batch, into `sink` (a foreachBatch function) or nowhere."""
    writer = (
        spark.readStream.schema("key string, value long")
        .option("maxFilesPerTrigger", 1)
        .json(str(input_dir))
        .groupBy("key")
        .agg(F.sum("value").alias("total"))
        .writeStream.outputMode("update")
    )
    writer = writer.foreachBatch(sink) if sink is not None else writer.format("noop")
    return writer.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()


@pytest.mark.parametrize("commit_mode", ["changelog", "snapshot"])
def test_snapshots_are_reported_so_spark_never_forces_them(
    spark: SparkSession, tmp_path: Path, commit_mode: str
) -> None:
    input_dir, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    write_batches(input_dir, BATCHES)
    spark.conf.set("spark.sql.streaming.stateStore.pystatestore.commitMode", commit_mode)
    state_dir = "file:" + str(checkpoint / "state")
    run: dict[str, str] = {}
    heard: dict[int, int | None] = {}  # the coordinator's record of each partition, as of the last batch

    def ask_coordinator(batch: DataFrame, batch_id: int) -> None:
        # Asked while the query runs: Spark forgets a query's stores once it stops.
        if "id" in run:
            heard.update({p: coordinator_snapshot_version(spark, state_dir, p, run["id"]) for p in range(2)})
        batch.count()

    query = start_aggregation(spark, input_dir, checkpoint, ask_coordinator)
    run["id"] = str(query.runId)
    query.awaitTermination(600)
    assert query.exception() is None, query.exception()
    progress = query.recentProgress

    for partition in range(2):
        store = checkpoint / "state" / "0" / str(partition)
        versions = len([p for p in (store / "manifests").glob("*.json") if re.fullmatch(r"\d+\.json", p.name)])
        assert versions == BATCHES
        snapshots = snapshot_files(store, commit_mode)
        if commit_mode == "changelog":
            # One per MIN_DELTAS versions is due; forced snapshots would make most versions one.
            assert 0 < snapshots <= versions // MIN_DELTAS + 2, (partition, snapshots, versions)
        else:
            assert snapshots == versions
        # When the last batch started (version BATCHES - 1 committed), the coordinator knew of a
        # snapshot at most a few snapshot intervals (and maintenance runs) behind.
        reported = heard.get(partition)
        assert reported is not None, f"Spark's coordinator never heard of a snapshot of partition {partition}"
        assert reported >= versions - 1 - 3 * MIN_DELTAS, (partition, reported, versions)
    metrics = [op["customMetrics"] for p in progress for op in p["stateOperators"]]
    forced = sum(m.get("pystatestoreSnapshotsForced", 0) for m in metrics)
    assert forced == 0, f"Spark forced {forced} snapshots: it judged the stores lagging"
    # Spark's own per-store metric of the newest snapshot, as its built-in providers report it.
    last = progress[-1]["stateOperators"][0]["customMetrics"]
    assert any(k.startswith("SnapshotLastUploaded.partition_") for k in last), sorted(last)


def test_a_commit_that_makes_a_snapshot_due_gets_it_without_waiting_for_maintenance(
    spark: SparkSession, tmp_path: Path
) -> None:
    """At Spark's default maintenance interval (60 s) tens of fast batches pass between maintenance
    runs; the snapshot a commit makes due is made at once, off the commit path. Here maintenance
    would not run at all within the test: every snapshot in the files came from commits."""
    input_dir, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    batches = 12
    write_batches(input_dir, batches)
    spark.conf.set("spark.sql.streaming.stateStore.pystatestore.commitMode", "changelog")
    spark.conf.set("spark.sql.streaming.stateStore.maintenanceInterval", "10min")
    try:
        query = start_aggregation(spark, input_dir, checkpoint)
        query.awaitTermination(600)
        assert query.exception() is None, query.exception()
        time.sleep(3)  # the last snapshots are made in the background
    finally:
        spark.conf.set("spark.sql.streaming.stateStore.maintenanceInterval", "1s")
    for partition in range(2):
        snapshots = snapshot_files(checkpoint / "state" / "0" / str(partition), "changelog")
        assert batches // MIN_DELTAS - 1 <= snapshots <= batches // MIN_DELTAS, (partition, snapshots)
