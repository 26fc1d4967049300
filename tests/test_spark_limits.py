"""What Spark itself allows only to its RocksDB provider, as README's Limits say, checked against
the running Spark: a change in a Spark release that lifts or moves a gate fails here, so the README
is corrected rather than left wrong."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQueryException

from spark_support import start_session

PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
MINOR = tuple(int(p) for p in pyspark.__version__.split(".")[:2])


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    # transformWithStateInPandas runs the processor's init on the driver in a Python of its own,
    # PYSPARK_PYTHON's (python3 when unset), not spark.pyspark.python's: this one has pandas.
    previous = os.environ.get("PYSPARK_PYTHON")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    try:
        session = start_session("local[2]")
        yield session
        session.stop()
    finally:
        if previous is None:
            os.environ.pop("PYSPARK_PYTHON", None)
        else:
            os.environ["PYSPARK_PYTHON"] = previous


def counts_per_key_with_transform_with_state(spark: SparkSession, checkpoint: Path) -> None:
    """A transformWithStateInPandas query (a ValueState per key) run for one batch."""
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

    class Count(StatefulProcessor):
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.count = handle.getValueState("count", "n long")

        def handleInputRows(self, key, rows, timerValues):  # noqa: ANN001, ANN201, N802, N803 - Spark's names
            n = (self.count.get()[0] if self.count.exists() else 0) + sum(len(r) for r in rows)
            self.count.update((n,))
            yield pd.DataFrame({"key": [key[0]], "n": [n]})

        def close(self) -> None:
            pass

    source = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 10)
        .load()
        .selectExpr("CAST(value % 3 AS STRING) AS key")
    )
    counts = source.groupBy("key").transformWithStateInPandas(
        Count(), outputStructType="key string, n long", outputMode="Update", timeMode="None"
    )
    run_available_now(counts, checkpoint)


def run_available_now(stream: DataFrame, checkpoint: Path) -> None:
    """Runs `stream` over what its source has, into Spark's no-op sink, in update mode."""
    query = (
        stream.writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(120)
    finally:
        query.stop()


def test_transform_with_state_runs_on_4_1_and_4_2_on_refuses_with_the_error_readme_names(
    spark: SparkSession, tmp_path: Path
) -> None:
    """4.2+: Spark's own gate by the provider's class name; 4.1 has none, and pystatestore runs it
    (tests/test_transform_with_state.py compares it with Spark's RocksDB provider)."""
    if MINOR >= (4, 2):
        with pytest.raises(StreamingQueryException, match="STORE_BACKEND_NOT_SUPPORTED_FOR_TWS"):
            counts_per_key_with_transform_with_state(spark, tmp_path / "tws")
    else:
        counts_per_key_with_transform_with_state(spark, tmp_path / "tws")
        assert (tmp_path / "tws" / "state" / "0" / "0" / "manifests" / "1.json").is_file()


@pytest.mark.skipif(MINOR < (4, 3), reason="Real-Time Mode comes with Spark 4.3")
def test_real_time_mode_is_refused_while_the_session_names_pystatestore(spark: SparkSession, tmp_path: Path) -> None:
    """Spark 4.3 refuses every Real-Time Mode query, stateless ones included, while the session's
    providerClass names anything but its RocksDB provider; a session that unsets it (or names
    RocksDB) before starting one runs it, as README tells."""

    def start_real_time(checkpoint: Path) -> None:
        query = (
            spark.readStream.format("rate")
            .load()
            .writeStream.format("console")
            .outputMode("update")
            .option("checkpointLocation", str(checkpoint))
            .trigger(realTime="5 seconds")
            .start()
        )
        query.stop()

    assert spark.conf.get(PROVIDER_CONF) == "org.pystatestore.PythonStateStoreProvider"
    with pytest.raises(Exception, match="STREAMING_REAL_TIME_MODE.SQL_CONFIGURATION_NOT_SUPPORTED"):
        start_real_time(tmp_path / "refused")
    previous = spark.conf.get(PROVIDER_CONF)
    try:
        for setting in (None, ROCKSDB):
            if setting is None:
                spark.conf.unset(PROVIDER_CONF)
            else:
                spark.conf.set(PROVIDER_CONF, setting)
            start_real_time(tmp_path / f"runs-{setting or 'unset'}")
    finally:
        spark.conf.set(PROVIDER_CONF, previous)
