"""Changelog commits seen from Spark: the state data source's change feed and snapshot replay on our
checkpoints equal Spark's RocksDB provider's (changelog checkpointing) for the same query and input,
and a checkpoint written in one commit mode restores in the other."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pystatestore.store.manifest import snapshot_of
from queries import aggregation
from spark_support import (
    OUR_PROVIDER,
    ROCKSDB_PROVIDER,
    run_phase,
    start_session,
    unload_state_stores,
    write_input_files,
)

pytestmark = pytest.mark.spark
MODE_CONF = "spark.sql.streaming.stateStore.pystatestore.commitMode"
BATCHES = 8


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = start_session(
        "local[2]",
        **{
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.streaming.stateStore.maintenanceInterval": "1s",
            "spark.sql.streaming.stateStore.minDeltasForSnapshot": "2",
            "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
            "spark.sql.streaming.minBatchesToRetain": "100",
        },
    )
    yield session
    session.stop()


def windowed_counts(df: DataFrame) -> DataFrame:
    """Windows close as the watermark passes them, so their state rows are deleted: the feed has
    both kinds of change."""
    return (
        df.withWatermark("ts", "10 seconds").groupBy(F.window("ts", "10 seconds"), "key").agg(F.count("*").alias("n"))
    )


QUERIES = {"aggregation": (aggregation, "update"), "windowed": (windowed_counts, "append")}


def run_both(spark: SparkSession, tmp_path: Path, query: str) -> dict[str, Path]:
    build, output_mode = QUERIES[query]
    input_dir = tmp_path / "in"
    write_input_files(input_dir, 0, BATCHES)
    checkpoints = {}
    for name, provider in (("spark", ROCKSDB_PROVIDER), ("ours", OUR_PROVIDER)):
        checkpoints[name] = tmp_path / f"ckpt-{name}"
        run_phase(
            spark,
            build,
            provider=provider,
            input_dir=input_dir,
            checkpoint=checkpoints[name],
            output_mode=output_mode,
            results={},
        )
    return checkpoints


def aggregate(spark: SparkSession, provider: str, input_dir: Path, checkpoint: Path, results: dict) -> None:
    run_phase(
        spark,
        aggregation,
        provider=provider,
        input_dir=input_dir,
        checkpoint=checkpoint,
        output_mode="update",
        results=results,
    )


def rows(df: DataFrame) -> list[tuple]:
    return sorted((tuple(r) for r in df.collect()), key=repr)


def change_feed(spark: SparkSession, checkpoint: Path, start: int, end: int) -> list[tuple]:
    df = (
        spark.read.format("statestore")
        .option("readChangeFeed", True)
        .option("changeStartBatchId", start)
        .option("changeEndBatchId", end)
        .load(str(checkpoint))
    )
    return rows(df.select("batch_id", "change_type", "key", "value", "partition_id"))


def last_batch(checkpoint: Path) -> int:
    """The last committed batch (a watermark query runs a batch without data after the last file)."""
    return max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())


@pytest.mark.parametrize("query", sorted(QUERIES))
def test_change_feed_equals_spark_rocksdb_changelog(spark: SparkSession, tmp_path: Path, query: str) -> None:
    spark.conf.set(MODE_CONF, "changelog")
    checkpoints = run_both(spark, tmp_path, query)
    last = last_batch(checkpoints["spark"])
    assert last_batch(checkpoints["ours"]) == last >= BATCHES - 1
    for start, end in ((0, last), (2, 4)):
        ours = change_feed(spark, checkpoints["ours"], start, end)
        theirs = change_feed(spark, checkpoints["spark"], start, end)
        assert ours == theirs, f"change feed of batches {start}-{end} differs"
        assert {r[0] for r in ours} == set(range(start, end + 1))
    kinds = {r[1] for r in change_feed(spark, checkpoints["ours"], 0, last)}
    assert kinds == ({"update", "delete"} if query == "windowed" else {"update"})


def snapshot_versions(checkpoint: Path, partition: int, ours: bool) -> set[int]:
    """Versions of partition `partition` that have a snapshot to replay from."""
    store = checkpoint / "state" / "0" / str(partition)
    if not ours:
        return {int(p.name.split(".")[0].split("_")[0]) for p in store.glob("*.zip")}
    made_later = {key[0] for p in (store / "snapshots").glob("*.json") if (key := snapshot_of(f"snapshots/{p.name}"))}
    committed = {
        int(p.stem) for p in (store / "manifests").glob("*.json") if json.loads(p.read_bytes())["kind"] == "snapshot"
    }
    return made_later | committed


def replayed(spark: SparkSession, checkpoint: Path, snapshot_batch: int, batch: int, partition: int) -> list[tuple]:
    df = (
        spark.read.format("statestore")
        .option("snapshotStartBatchId", snapshot_batch)
        .option("snapshotPartitionId", partition)
        .option("batchId", batch)
        .load(str(checkpoint))
    )
    return rows(df.select("key", "value", "partition_id"))


def test_snapshot_replay_equals_spark_rocksdb(spark: SparkSession, tmp_path: Path) -> None:
    spark.conf.set(MODE_CONF, "changelog")
    checkpoints = run_both(spark, tmp_path, "windowed")
    last = last_batch(checkpoints["spark"])
    assert last_batch(checkpoints["ours"]) == last
    time.sleep(3)  # the query's providers were unloaded; maintenance made its last snapshots before that
    unload_state_stores(spark)  # and nothing snapshots or collects any more while the test reads
    for partition in (0, 1):
        ours = snapshot_versions(checkpoints["ours"], partition, ours=True)
        theirs = snapshot_versions(checkpoints["spark"], partition, ours=False)
        assert ours, f"partition {partition}: maintenance made no snapshot in {BATCHES} batches"
        # Spark's plain read of its own checkpoint at every batch is the reference.
        plain = {
            batch: rows(
                spark.read.format("statestore")
                .option("batchId", batch)
                .load(str(checkpoints["spark"]))
                .where(F.col("partition_id") == partition)
                .select("key", "value", "partition_id")
            )
            for batch in range(last + 1)
        }
        # Replaying from each of our snapshots gives Spark's state at every batch from it on.
        for version in sorted(ours):
            for batch in range(version - 1, last + 1):
                got = replayed(spark, checkpoints["ours"], version - 1, batch, partition)
                assert got == plain[batch], f"partition {partition}, snapshot of version {version}, batch {batch}"
        # Spark's own snapshots, read the same way, give the same: the reference reads as it should.
        for version in sorted(theirs):
            assert replayed(spark, checkpoints["spark"], version - 1, last, partition) == plain[last]


def test_a_missing_snapshot_and_a_snapshot_commit_get_clear_errors(spark: SparkSession, tmp_path: Path) -> None:
    spark.conf.set(MODE_CONF, "snapshot")
    input_dir, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    write_input_files(input_dir, 0, 3)
    aggregate(spark, OUR_PROVIDER, input_dir, checkpoint, {})
    with pytest.raises(Exception, match="committed as a snapshot, which records no changes"):
        change_feed(spark, checkpoint, 0, 2)
    spark.conf.set(MODE_CONF, "changelog")
    spark.conf.set("spark.sql.streaming.stateStore.minDeltasForSnapshot", "100")  # no snapshot after version 0
    checkpoint2 = tmp_path / "ckpt2"
    aggregate(spark, OUR_PROVIDER, input_dir, checkpoint2, {})
    spark.conf.set("spark.sql.streaming.stateStore.minDeltasForSnapshot", "2")
    with pytest.raises(Exception, match="no snapshot of version 3"):
        replayed(spark, checkpoint2, 2, 2, 0)


@pytest.mark.parametrize(("first", "second"), [("snapshot", "changelog"), ("changelog", "snapshot")])
def test_a_checkpoint_restores_in_the_other_mode(spark: SparkSession, tmp_path: Path, first: str, second: str) -> None:
    input_dir = tmp_path / "in"
    expected: dict[int, list[tuple]] = {}
    write_input_files(input_dir, 0, 6)
    aggregate(spark, ROCKSDB_PROVIDER, input_dir, tmp_path / "ref", expected)
    input2 = tmp_path / "in2"
    write_input_files(input2, 0, 3)
    got: dict[int, list[tuple]] = {}
    spark.conf.set(MODE_CONF, first)
    aggregate(spark, OUR_PROVIDER, input2, tmp_path / "ckpt", got)
    write_input_files(input2, 3, 3)
    spark.conf.set(MODE_CONF, second)
    aggregate(spark, OUR_PROVIDER, input2, tmp_path / "ckpt", got)
    assert got == expected
    kinds = set()
    for p in (tmp_path / "ckpt" / "state" / "0").glob("*/manifests/*.json"):
        kinds.add(b'"changelog"' in p.read_bytes())
    assert kinds == {True, False}, "both modes should have committed versions"
