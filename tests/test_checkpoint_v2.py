"""Spark's checkpoint format v2 (`checkpointFormatVersion=2`) end to end, on every supported minor:
queries with a restart equal Spark's RocksDB provider in v2 row for row, the ids Spark writes to its
commit log are the attempts pystatestore published, a retried task's second commit of one version
is the one the next batch and a restart load, and a restart loads the attempt the commit log names
even when a straggler published another one of that version later."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

import referee
from queries import aggregation, dedup, join, pandas_sessions, session_windows
from spark_support import OUR_PROVIDER, ROCKSDB_PROVIDER, run_with_restart, start_session
from test_cli import our_rows, spark_rows

pytestmark = pytest.mark.spark
V2 = {"spark.sql.streaming.stateStore.checkpointFormatVersion": "2"}
SCENARIOS = {
    "aggregation_update": (aggregation, "update"),
    "drop_duplicates": (dedup, "append"),
    "apply_in_pandas_with_state_timeout": (pandas_sessions, "update"),
    "session_window_prefix_scan": (session_windows, "append"),
    "stream_stream_join": (join, "append"),
}


@pytest.fixture(scope="module")
def fired(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the injected fault of the retry test records that it fired (once, in all executors)."""
    return tmp_path_factory.mktemp("fault") / "fired"


@pytest.fixture(scope="module")
def spark(fired: Path) -> Iterator[SparkSession]:
    # Executors are separate JVMs (their workers inherit executorEnv): a fault rule reaches them, and
    # a failed task is retried, as on a cluster. The rule fires once: the first commit of version 3
    # of partition 1 of the retry test's store fails right after its manifest is published.
    rule = {
        "store": "retried-task/ckpt-PythonStateStoreProvider/state/0/1",
        "point": "commit:manifest-written",
        "action": "fail",
        "after": 2,
        "once": str(fired),
        "record": str(fired) + ".log",
    }
    session = start_session(
        "local-cluster[2,1,1024]",
        **V2,
        **{"spark.executorEnv.PYSTATESTORE_TEST_FAULTS": json.dumps([rule]), "spark.task.maxFailures": "4"},
    )
    yield session
    session.stop()


def commit_log_ids(checkpoint: Path) -> dict[int, dict[str, list[list[str]]]]:
    """Batch -> operator -> partition -> store ids, as Spark's commit log records them (format v2)."""
    found = {}
    for f in (checkpoint / "commits").iterdir():
        if f.name.isdigit():
            header, body = f.read_text().split("\n", 1)
            assert header == "v2", f"{f}: commit log entry of format {header}, expected v2"
            found[int(f.name)] = json.loads(body)["stateUniqueIds"]
    return found


def store_dirs(checkpoint: Path, operator: int = 0) -> dict[tuple[int, str], Path]:
    """(partition, store name) -> store directory; a join's four stores live under <partition>/<name>."""
    out = {}
    for d in (checkpoint / "state" / str(operator)).iterdir():
        if not d.name.isdigit():
            continue
        if (d / "manifests").is_dir():
            out[(int(d.name), "default")] = d
        for sub in d.iterdir():
            if (sub / "manifests").is_dir():
                out[(int(d.name), sub.name)] = sub
    return out


# The ids flow the same way for every operator: an aggregation (one store a partition) and a join
# (four) in the test command, every operator in the long runs (PYSTATESTORE_TEST_MATRIX=full).
IN_THE_TEST_COMMAND = ("aggregation_update", "stream_stream_join")
V2_SCENARIOS = [
    s
    if s in IN_THE_TEST_COMMAND or os.environ.get("PYSTATESTORE_TEST_MATRIX") == "full"
    else pytest.param(s, marks=pytest.mark.slow)
    for s in SCENARIOS
]


@pytest.mark.parametrize("scenario", V2_SCENARIOS)
def test_v2_queries_equal_sparks_rocksdb_provider_in_v2(spark: SparkSession, scenario: str, tmp_path: Path) -> None:
    build, mode = SCENARIOS[scenario]
    expected, _ = run_with_restart(spark, build, provider=ROCKSDB_PROVIDER, workdir=tmp_path, output_mode=mode)
    actual, _ = run_with_restart(spark, build, provider=OUR_PROVIDER, workdir=tmp_path, output_mode=mode)
    assert len(expected) >= 6 and sum(len(rows) for rows in expected.values()) > 0
    assert actual == expected
    checkpoint = tmp_path / "ckpt-PythonStateStoreProvider"
    ids = commit_log_ids(checkpoint)
    stores = store_dirs(checkpoint)
    assert len(ids) >= 6 and stores
    for batch, by_operator in ids.items():
        for partition, names in enumerate(by_operator["0"]):
            # Spark orders a join's stores as its four store names; others have one store, "default".
            dirs = sorted(d for (p, _), d in stores.items() if p == partition)
            assert len(names) == len(dirs), (batch, partition, names, dirs)
            for cid in names:
                assert any((d / "manifests" / f"{batch + 1}-{cid}.json").exists() for d in dirs), (batch, cid)
    for d in stores.values():
        unnamed = [p.name for p in (d / "manifests").iterdir() if re.fullmatch(r"\d+\.json", p.name)]
        assert not unnamed, f"{d}: manifests named by version alone: {unnamed}"
        verdict = referee.judge_store(d, now=1e12)
        assert not verdict.lost, verdict.lost


def test_a_retried_tasks_commit_is_the_one_spark_continues_from(
    spark: SparkSession, fired: Path, tmp_path: Path
) -> None:
    """Version 3 of partition 1 is committed twice: its first attempt fails after publishing (the task
    fails), its retry commits again. Both attempts stay; the commit log names the retry's, and the
    rest of the run and the restart build on it."""
    expected, _ = run_with_restart(
        spark, aggregation, provider=ROCKSDB_PROVIDER, workdir=tmp_path / "reference", output_mode="update"
    )
    workdir = tmp_path / "retried-task"
    actual, _ = run_with_restart(spark, aggregation, provider=OUR_PROVIDER, workdir=workdir, output_mode="update")
    assert fired.exists(), "the injected failure did not fire"
    assert actual == expected
    checkpoint = workdir / "ckpt-PythonStateStoreProvider"
    store = checkpoint / "state" / "0" / "1"
    attempts = sorted(p.name for p in (store / "manifests").glob("3-*.json"))
    assert len(attempts) == 2, attempts
    named = commit_log_ids(checkpoint)[2]["0"][1][0]
    assert f"3-{named}.json" in attempts
    retry = max((store / "manifests" / a for a in attempts), key=lambda p: json.loads(p.read_bytes())["created_at"])
    assert retry.name == f"3-{named}.json", "the commit log names the retry's attempt"
    version_4 = json.loads(next((store / "manifests").glob("4-*.json")).read_bytes())
    assert version_4.get("parent_manifest_id", named) == named or version_4["kind"] == "snapshot"
    assert not referee.judge_store(store, now=1e12).lost


def test_a_restart_loads_the_attempt_the_commit_log_names(spark: SparkSession, tmp_path: Path) -> None:
    """After the first run, a straggler publishes another attempt of every store's last version (with
    other values) after the query stopped. Under format v1 the last manifest written wins; under v2
    the restart must load the attempt Spark's commit log names and give the same rows as RocksDB."""
    from pystatestore.store.backends import BACKENDS, StoreContext
    from pystatestore.store.manifest import Manifest
    from pystatestore.store.remote import RemoteStore

    expected, _ = run_with_restart(
        spark, aggregation, provider=ROCKSDB_PROVIDER, workdir=tmp_path / "reference", output_mode="update"
    )
    workdir = tmp_path / "straggler"
    checkpoint = workdir / "ckpt-PythonStateStoreProvider"
    stragglers: list[Path] = []

    def straggle(phase: int) -> None:
        if phase != 1:
            return
        last_batch = max(commit_log_ids(checkpoint))
        names = commit_log_ids(checkpoint)[last_batch]["0"]
        for (partition, _), store in store_dirs(checkpoint).items():
            named = names[partition][0]
            m = Manifest.from_json(
                (store / "manifests" / f"{last_batch + 1}-{named}.json").read_bytes(),
                store=str(store),
                version=last_batch + 1,
                file="",
            )
            ctx = StoreContext(
                store_dir=f"file:{store}",
                operator_id=0,
                partition_id=partition,
                store_name="default",
                key_schema=m.key_schema,
                value_schema=m.value_schema,
                min_versions_to_retain=100,
                orphan_grace_seconds=600.0,
                local_dir=str(tmp_path / f"straggler-{partition}"),
                options={"localRecovery": "false"},
                key_encoding=m.key_encoding,
                checkpoint_ids=True,
            )
            backend = BACKENDS["rocksdb"](ctx, RemoteStore(ctx.store_dir))
            # Version last+1 again, on the same base, without the last batch's changes.
            base_id = m.parent_manifest_id if m.is_changelog else None
            assert base_id, "the straggler needs the base attempt the named one was committed on"
            empty = pa.table(
                {"op": pa.array([], pa.int8()), "key": pa.array([], pa.binary()), "value": pa.array([], pa.binary())}
            )
            base_doc = json.loads((store / "manifests" / f"{last_batch}-{base_id}.json").read_bytes())
            r = backend.commit(last_batch, empty, "straggler", base_id, num_keys=base_doc["num_keys"])
            backend.close()
            stragglers.append(store / "manifests" / f"{last_batch + 1}-{r.manifest_id}.json")

    actual, _ = run_with_restart(
        spark, aggregation, provider=OUR_PROVIDER, workdir=workdir, output_mode="update", before_phase=straggle
    )
    assert stragglers and all(p.exists() for p in stragglers)
    assert actual == expected
    # Spark's state reader and `pystatestore read` read the attempts the commit log names too: the
    # straggler's batch and the last one, as the RocksDB provider's checkpoint holds them.
    reference = tmp_path / "reference" / "ckpt-RocksDBStateStoreProvider"
    straggled = int(stragglers[0].name.split("-")[0]) - 1
    for batch in (straggled, max(commit_log_ids(checkpoint))):
        theirs = spark_rows(spark, reference, batchId=batch)
        assert theirs
        assert spark_rows(spark, checkpoint, batchId=batch) == theirs
        assert our_rows(checkpoint, batch=batch) == theirs
