"""End to end: real streaming queries on our provider, row for row against Spark's HDFS provider,
each with a stop and a restart from the same checkpoint, on local[2] and local-cluster[2,1,1024]."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupStateTimeout

from spark_support import COMMIT_MODES, HDFS_PROVIDER, MASTERS, OUR_PROVIDER, run_with_restart, start_session

pytestmark = pytest.mark.spark
MODE_CONF = "spark.sql.streaming.stateStore.pystatestore.commitMode"


@pytest.fixture(scope="module", params=MASTERS)
def spark(request: pytest.FixtureRequest) -> Iterator[SparkSession]:
    session = start_session(request.param)
    yield session
    session.stop()


@pytest.fixture(params=COMMIT_MODES)
def commit_mode(request: pytest.FixtureRequest, spark: SparkSession) -> Iterator[str]:
    """The rocksdb backend's two ways to commit: every scenario must give the same rows in both."""
    spark.conf.set(MODE_CONF, request.param)
    yield request.param
    spark.conf.unset(MODE_CONF)


def aggregation(df: DataFrame) -> DataFrame:
    return df.groupBy("key").agg(F.count("*").alias("n"), F.sum("value").alias("total"), F.max("id").alias("top"))


def dedup(df: DataFrame) -> DataFrame:
    return df.dropDuplicates(["id"]).select("id", "key", "value")


def pandas_sessions(df: DataFrame) -> DataFrame:
    def count_until_quiet(key: tuple, pdfs: Iterator[pd.DataFrame], state) -> Iterator[pd.DataFrame]:  # noqa: ANN001
        if state.hasTimedOut:
            (count,) = state.get
            state.remove()
            yield pd.DataFrame({"key": [key[0]], "count": [count], "timed_out": [True]})
            return
        count = state.get[0] if state.exists else 0
        latest = 0
        for pdf in pdfs:
            count += len(pdf)
            latest = max(latest, int(pdf["ts"].max().timestamp() * 1000))
        state.update((count,))
        state.setTimeoutTimestamp(latest + 15_000)
        yield pd.DataFrame({"key": [key[0]], "count": [count], "timed_out": [False]})

    return (
        df.withWatermark("ts", "5 seconds")
        .groupBy("key")
        .applyInPandasWithState(
            count_until_quiet,
            "key string, count long, timed_out boolean",
            "count long",
            "update",
            GroupStateTimeout.EventTimeTimeout,
        )
    )


def session_windows(df: DataFrame) -> DataFrame:
    """Session windows keep their state in a prefix-scan store (prefix: the grouping key)."""
    return (
        df.withWatermark("ts", "10 seconds")
        .groupBy(F.session_window("ts", "5 seconds"), "key")
        .agg(F.count("*").alias("n"), F.sum("value").alias("total"))
        .select(
            F.col("session_window.start").cast("string"),
            F.col("session_window.end").cast("string"),
            "key",
            "n",
            "total",
        )
    )


SCENARIOS = {
    "aggregation_update": (aggregation, "update"),
    "aggregation_complete": (aggregation, "complete"),
    "drop_duplicates": (dedup, "append"),
    "apply_in_pandas_with_state_timeout": (pandas_sessions, "update"),
    "session_window_prefix_scan": (session_windows, "append"),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_same_rows_as_the_builtin_provider(
    spark: SparkSession, commit_mode: str, scenario: str, tmp_path: Path
) -> None:
    build, mode = SCENARIOS[scenario]
    expected, _ = run_with_restart(spark, build, provider=HDFS_PROVIDER, workdir=tmp_path, output_mode=mode)
    actual, progress = run_with_restart(spark, build, provider=OUR_PROVIDER, workdir=tmp_path, output_mode=mode)
    assert len(expected) >= 6, f"expected at least 6 batches, got {sorted(expected)}"
    assert sum(len(rows) for rows in expected.values()) > 0
    assert actual == expected
    # our metrics reach StreamingQueryProgress
    metrics = progress["stateOperators"][0]["customMetrics"]
    assert "pystatestoreCommitMs" in metrics and metrics["pystatestoreBytesWritten"] > 0
    # the restart really reloaded state through the worker
    state_dir = tmp_path / "ckpt-PythonStateStoreProvider" / "state" / "0"
    assert any(state_dir.glob("*/manifests/*.json"))
    kinds = {json.loads(m.read_text())["kind"] for m in state_dir.glob("*/manifests/*.json")}
    assert kinds == {commit_mode}, kinds
    if scenario == "session_window_prefix_scan":  # the prefix layout, read by seeks in the JVM
        encodings = {json.loads(m.read_text())["key_encoding"] for m in state_dir.glob("*/manifests/*.json")}
        assert encodings == {"prefix-v1"}, encodings
    if spark.sparkContext.master.startswith("local-cluster"):
        # every version was written by a worker of an executor JVM, never one of the driver's
        driver_pid = spark._jvm.java.lang.ProcessHandle.current().pid()
        writers = {json.loads(m.read_text())["writer"]["jvmPid"] for m in state_dir.glob("*/manifests/*.json")}
        assert writers and driver_pid not in writers, (driver_pid, writers)


def test_timeouts_fired_in_the_pandas_scenario(spark: SparkSession, tmp_path: Path) -> None:
    """Guards the scenario above against passing vacuously: timeouts must really fire."""
    actual, _ = run_with_restart(spark, pandas_sessions, provider=OUR_PROVIDER, workdir=tmp_path, output_mode="update")
    assert any(row[2] for rows in actual.values() for row in rows), "no group timed out"
