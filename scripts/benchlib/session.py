"""The child's side: the SparkSession of one provider's query, in the driver JVM this process
starts, and a record of its progress. Imports PySpark and pystatestore on import (a child that
times its session's start imports this first)."""

from __future__ import annotations

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
