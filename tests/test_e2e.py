"""End to end: real streaming queries on our provider, row for row against Spark's HDFS provider,
each with a stop and a restart from the same checkpoint.

Every query runs once, on one master and in one commit mode, so that between them the queries
cover both masters (`local[2]`; `local-cluster[2,1,1024]`, whose executors are JVMs of their own)
and both commit modes: what a query exercises is the operator's use of the store, and what the
master or the mode changes is the same for every operator. `PYSTATESTORE_TEST_MATRIX=full` (the
long runs, `scripts/long.sh`) runs every query on every master in every mode."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from queries import aggregation, dedup, pandas_sessions, session_windows
from spark_support import COMMIT_MODES, HDFS_PROVIDER, MASTERS, OUR_PROVIDER, run_with_restart, start_session

pytestmark = pytest.mark.spark
MODE_CONF = "spark.sql.streaming.stateStore.pystatestore.commitMode"
LOCAL, CLUSTER = "local[2]", "local-cluster[2,1,1024]"

# query -> (build, output mode, the master and commit mode it runs on in the test command)
SCENARIOS: dict[str, tuple[Callable[[DataFrame], DataFrame], str, str, str]] = {
    "aggregation_update": (aggregation, "update", CLUSTER, "changelog"),
    "aggregation_complete": (aggregation, "complete", LOCAL, "snapshot"),
    "drop_duplicates": (dedup, "append", LOCAL, "changelog"),
    "apply_in_pandas_with_state_timeout": (pandas_sessions, "update", CLUSTER, "snapshot"),
    "session_window_prefix_scan": (session_windows, "append", CLUSTER, "changelog"),
}


def cases() -> list[tuple[str, str, str]]:
    """(scenario, master, commit mode): each scenario on its own pair, or every pair in the full
    matrix; only masters and modes this run allows (the other minors: local-cluster, changelog)."""
    full = os.environ.get("PYSTATESTORE_TEST_MATRIX") == "full"
    chosen = []
    for name, (_, _, master, mode) in SCENARIOS.items():
        pairs = itertools.product(MASTERS, COMMIT_MODES) if full else [(master, mode)]
        chosen += [(name, m, c) for m, c in pairs if m in MASTERS and c in COMMIT_MODES]
    return chosen


@pytest.fixture(scope="module")
def spark(request: pytest.FixtureRequest) -> Iterator[SparkSession]:
    """One session per master (pytest runs the tests of one master together)."""
    session = start_session(request.param)
    yield session
    session.stop()


CASES = cases()


@pytest.mark.parametrize(
    ("scenario", "spark", "commit_mode"), CASES, indirect=["spark"], ids=["-".join(c) for c in CASES]
)
def test_same_rows_as_the_builtin_provider(
    spark: SparkSession, scenario: str, commit_mode: str, tmp_path: Path
) -> None:
    build, mode, _, _ = SCENARIOS[scenario]
    expected, _ = run_with_restart(spark, build, provider=HDFS_PROVIDER, workdir=tmp_path, output_mode=mode)
    spark.conf.set(MODE_CONF, commit_mode)
    try:
        actual, progress = run_with_restart(spark, build, provider=OUR_PROVIDER, workdir=tmp_path, output_mode=mode)
    finally:
        spark.conf.unset(MODE_CONF)
    assert len(expected) >= 6, f"expected at least 6 batches, got {sorted(expected)}"
    assert sum(len(rows) for rows in expected.values()) > 0
    assert actual == expected
    if scenario == "apply_in_pandas_with_state_timeout":  # not vacuous: timeouts really fired
        assert any(row[2] for rows in actual.values() for row in rows), "no group timed out"
    # our metrics reach StreamingQueryProgress
    metrics = progress["stateOperators"][0]["customMetrics"]
    assert "pystatestoreCommitMs" in metrics and metrics["pystatestoreBytesWritten"] > 0
    # the restart really reloaded state through the worker
    state_dir = tmp_path / "ckpt-PythonStateStoreProvider" / "state" / "0"
    manifests = [json.loads(m.read_text()) for m in state_dir.glob("*/manifests/*.json")]
    assert manifests
    assert {m["kind"] for m in manifests} == {commit_mode}
    if scenario == "session_window_prefix_scan":  # the prefix layout, read by seeks in the JVM
        assert {m["key_encoding"] for m in manifests} == {"prefix-v1"}
    if spark.sparkContext.master.startswith("local-cluster"):
        # every version was written by a worker of an executor JVM, never one of the driver's
        driver_pid = spark._jvm.java.lang.ProcessHandle.current().pid()
        writers = {m["writer"]["jvmPid"] for m in manifests}
        assert writers and driver_pid not in writers, (driver_pid, writers)


def test_between_them_the_cases_cover_both_masters_and_both_modes() -> None:
    """What the single pairs leave out is what no master or mode changes: each is still run."""
    pairs = {(master, mode) for _, _, master, mode in SCENARIOS.values()}
    assert {m for m, _ in pairs} == {LOCAL, CLUSTER} and {c for _, c in pairs} == {"changelog", "snapshot"}
