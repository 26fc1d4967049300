"""The child's side: the SparkSession of one provider's query, in the driver JVM this process
starts, and a record of its progress. Imports PySpark and pystatestore on import (a child that
times its session's start imports this first)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQueryListener

import pystatestore


def start_session(app: str, *, partitions: int, sql_conf: Mapping[str, str] | None = None, **session_conf: str) -> Any:
    """A SparkSession on local[2] with `partitions` shuffle partitions, no UI and no console
    progress, pystatestore's jar added (every run gets the same jars and confs, whatever its
    provider), `session_conf` set on the builder (static confs: driver memory, JVM options, jars),
    then `sql_conf` (the provider and its confs) set on the session."""
    builder = (
        SparkSession.builder.master("local[2]")
        .appName(app)
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
    )
    for key, value in session_conf.items():
        builder = builder.config(key, value)
    spark = pystatestore.configure_spark(builder).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    for key, value in (sql_conf or {}).items():
        spark.conf.set(key, value)
    return spark


def start_noop(frame: Any, checkpoint: Path | str, output_mode: str = "update") -> Any:
    """`frame` written to the noop sink until the input there is now is processed (availableNow):
    the started query."""
    return (
        frame.writeStream.outputMode(output_mode)
        .format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def run_count_until(
    spark: Any, input_dir: str, checkpoint: str, minutes: float, what: str, trigger: str | None = None
) -> None:
    """A count and sum per key over the input files (one per batch) to the noop sink, running for
    `minutes` (each batch as soon as the last ends, or every `trigger`), then stopped; fails naming
    `what` if the query did."""
    from pyspark.sql import functions as F

    source = spark.readStream.schema("key long, value long").option("maxFilesPerTrigger", 1).parquet(input_dir)
    writer = (
        source.groupBy("key")
        .agg(F.count("*").alias("n"), F.sum("value").alias("total"))
        .writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", checkpoint)
    )
    query = (writer.trigger(processingTime=trigger) if trigger else writer).start()
    deadline = time.time() + minutes * 60
    while time.time() < deadline and query.isActive:
        time.sleep(0.5)
    if query.exception() is not None:
        raise SystemExit(f"{what}: the query failed: {query.exception()}")
    query.stop()


def record_progress(spark: Any, path: Path) -> Any:
    """Appends every progress report of the session's queries to `path` as a JSON line, as Spark
    emits it (a listener: what a run records survives its end, however it ends). Returns the file,
    to close once the queries have stopped."""
    out = open(path, "a")  # noqa: SIM115 - written by the listener until the end

    class Recorder(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:  # noqa: N802 - Spark's names
            pass

        def onQueryProgress(self, event: Any) -> None:  # noqa: N802
            out.write(event.progress.json.replace("\n", " ") + "\n")
            out.flush()

        def onQueryIdle(self, event: Any) -> None:  # noqa: N802
            pass

        def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
            pass

    spark.streams.addListener(Recorder())
    return out
