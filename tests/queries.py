"""The streaming queries the end-to-end suites run, each a function from the input stream (the
events of `spark_support.write_input_files`) to the query's result, one per kind of stateful
operator: aggregation, dropDuplicates (and within a watermark), applyInPandasWithState with
event-time timeouts, session windows (a prefix-scan store), windows, a stream-stream join."""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupStateTimeout


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


def windowed(df: DataFrame) -> DataFrame:
    return (
        df.withWatermark("ts", "10 seconds")
        .groupBy(F.window("ts", "20 seconds"), "key")
        .agg(F.count("*").alias("n"), F.sum("value").alias("total"))
        .select(F.col("window.start").cast("string"), "key", "n", "total")
    )


def dedup_within_watermark(df: DataFrame) -> DataFrame:
    return df.withWatermark("ts", "10 seconds").dropDuplicatesWithinWatermark(["key", "value"]).select("key", "value")


def join(df: DataFrame) -> DataFrame:
    """A stream-stream join: four stores, two of them keyed by join key and value index."""
    left = df.where(F.col("value") % 2 == 0).select(F.col("key").alias("lk"), F.col("ts").alias("lts"), "value")
    right = df.where(F.col("value") % 2 == 1).select(F.col("key").alias("rk"), F.col("ts").alias("rts"), "id")
    return (
        left.withWatermark("lts", "10 seconds")
        .join(
            right.withWatermark("rts", "10 seconds"),
            F.expr("lk = rk AND rts BETWEEN lts - INTERVAL 5 SECONDS AND lts + INTERVAL 5 SECONDS"),
        )
        .select("lk", F.col("lts").cast("string"), "value", "id")
    )
