"""bench.py's streaming queries (bench_restore.py and profile_batches.py run them too): a state of N
keys loaded by the first micro-batch, then batches each updating a few of the keys, one input
file per batch, through one of four stateful operators:

- aggregation: groupBy(key).agg(count, sum);
- tws: transformWithStateInPandas keeping a session buffer per key (a count in a ValueState, its
  events appended to a ListState, an event-time timer an hour after its newest event, moved on each
  input), over a watermark (Spark 4.1: 4.2+ refuse transformWithState on any provider but theirs);
- sessions: applyInPandasWithState keeping a session's newest 64 events of 64 bytes per key, about
  4 KiB of state rewritten whenever the key has input (large values);
- flatmap-sessions: the same state kept by a Scala flatMapGroupsWithState (scripts/jvm/
  SessionBuffers.scala, compiled with the running Spark's Scala compiler): no Python UDF workers.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from benchlib import SCRIPTS
from benchlib.build import build_jar
from benchlib.inputs import random_updates, stamp_order
from benchlib.session import start_noop

RESTARTS = 3  # the input files written for restarts, one each
WARMUP_BATCHES = 3  # after the first batch (the load): the steady batches come after them


def write_inputs(input_dir: Path, keys: int, touched: int, batches: int, seed: int = 42) -> None:
    """Batch b's file, and (in restart-input/) the restarts' files: batch 1 + i's keys and values,
    with event times after every batch's (the tws workload's watermark would drop older ones)."""
    input_dir.mkdir(parents=True)
    restarts = input_dir.parent / "restart-input"
    restarts.mkdir()
    for b, (ks, values) in enumerate(random_updates(keys, touched, batches + 1, seed)):
        write_batch(input_dir / f"batch-{b:04d}.parquet", ks, values, second=b)
        if 1 <= b <= RESTARTS:
            write_batch(restarts / f"batch-restart-{b - 1}.parquet", ks, values, second=batches + b)


def write_batch(path: Path, keys: list[int], values: list[int], second: int) -> None:
    """One input file: keys and values, all at event time `second` (from 2026-01-01)."""
    when = dt.datetime(2026, 1, 1) + dt.timedelta(seconds=second)
    table = pa.table(
        {
            "key": pa.array(keys, pa.int64()),
            "value": pa.array(values, pa.int64()),
            "ts": pa.array([when] * len(keys), pa.timestamp("us")),
        }
    )
    pq.write_table(table, path)
    stamp_order(path, second)


def run_to_the_end(result: Any, checkpoint: Path) -> list[dict]:
    """`result` written to the noop sink in update mode until its input is processed; the progress
    reports of batches that had input."""
    query = start_noop(result, checkpoint)
    query.awaitTermination()
    if query.exception():
        raise SystemExit(f"query failed: {query.exception()}")
    return [p for p in query.recentProgress if p["numInputRows"] > 0]


def source(spark: Any, input_dir: Path, schema: str = "key long, value long, ts timestamp") -> Any:
    """The input files, one per batch."""
    return spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(input_dir))


def run_aggregation(spark: Any, input_dir: Path, checkpoint: Path) -> list[dict]:
    """Counts and sums per key over everything available, one file per batch."""
    from pyspark.sql import functions as F

    agg = source(spark, input_dir, "key long, value long").groupBy("key")
    return run_to_the_end(agg.agg(F.count("*").alias("n"), F.sum("value").alias("total")), checkpoint)


class SessionBuffer:
    """The tws workload's processor (a StatefulProcessor, made when pyspark is imported): per key a
    count, its events appended to a list, and an event-time timer an hour after its newest event,
    moved on each input, as a session timeout keeps it."""

    @staticmethod
    def make():  # noqa: ANN205 - the processor class, built on the StatefulProcessor of the running pyspark
        import pandas as pd
        from pyspark.sql.streaming.stateful_processor import StatefulProcessor

        class Processor(StatefulProcessor):
            def init(self, handle) -> None:  # noqa: ANN001
                self.handle = handle
                self.count = handle.getValueState("count", "n long")
                self.events = handle.getListState("events", "v long")
                self.timer = handle.getValueState("timer", "t long")

            def handleInputRows(self, key, rows, timerValues):  # noqa: ANN001, ANN201, N802, N803
                n = self.count.get()[0] if self.count.exists() else 0
                newest = 0
                for frame in rows:
                    self.events.appendList([(int(v),) for v in frame["value"]])
                    n += len(frame)
                    newest = max(newest, int(frame["ts"].max().timestamp() * 1000))
                self.count.update((n,))
                if self.timer.exists():
                    self.handle.deleteTimer(self.timer.get()[0])
                self.handle.registerTimer(newest + 3_600_000)
                self.timer.update((newest + 3_600_000,))
                yield pd.DataFrame({"key": [key[0]], "n": [n]})

            def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):  # noqa: ANN001, ANN201, N802, N803
                self.count.clear()
                self.events.clear()
                self.timer.clear()
                yield pd.DataFrame({"key": [key[0]], "n": [-1]})

            def close(self) -> None:
                pass

        return Processor()


def run_tws(spark: Any, input_dir: Path, checkpoint: Path) -> list[dict]:
    """The session buffer over everything available, one file per batch."""
    buffered = (
        source(spark, input_dir)
        .withWatermark("ts", "10 seconds")
        .groupBy("key")
        .transformWithStateInPandas(
            SessionBuffer.make(), outputStructType="key long, n long", outputMode="Update", timeMode="EventTime"
        )
    )
    return run_to_the_end(buffered, checkpoint)


# The sessions workload: a session's event buffer of about 4 KiB per key (issue 34, large values).
EVENT_BYTES = 64
SESSION_EVENTS = 64
EVENT_KINDS = ("view", "click", "cart", "search", "scroll", "buy")


def session_event(key: int, value: int, ts_ms: int) -> str:
    """One event as a session buffer keeps it: fixed-width text, as compressible as a log line."""
    page = (key * 7919 + value * 104729) % 1_000_003
    request = ((key * 0x9E3779B97F4A7C15) ^ (ts_ms * 0xBF58476D1CE4E5B9) ^ value) & 0xFFFFFFFFFFFFFFFF
    return f"{ts_ms:013d}|{EVENT_KINDS[value % 6]:<6}|/p/{page:07d}|v={value:04d}|rid={request:016x}|".ljust(
        EVENT_BYTES, "-"
    )


def session_buffer(key: tuple, frames, state):  # noqa: ANN001, ANN201 - applyInPandasWithState's function
    """Per key: how many events it had, and its newest SESSION_EVENTS events (a new key starts from
    its history, as a query started over a backlog would have it), about 4 KiB of state."""
    import pandas as pd

    k = int(key[0])
    if state.exists:
        n, events = state.get
    else:
        n, events = 0, "".join(session_event(k, h, h * 1000) for h in range(SESSION_EVENTS))
    for frame in frames:
        ts = frame["ts"].values.astype("datetime64[ms]").astype("int64")  # whatever unit pandas gave
        events += "".join(session_event(k, int(v), int(t)) for v, t in zip(frame["value"], ts, strict=True))
        n += len(frame)
    state.update((n, events[-SESSION_EVENTS * EVENT_BYTES :]))
    yield pd.DataFrame({"key": [k], "n": [n]})


def run_sessions(spark: Any, input_dir: Path, checkpoint: Path) -> list[dict]:
    """applyInPandasWithState keeping each key's newest events (about 4 KiB), one file per batch."""
    sessions = (
        source(spark, input_dir)
        .groupBy("key")
        .applyInPandasWithState(session_buffer, "key long, n long", "n long, events string", "update", "NoTimeout")
    )
    return run_to_the_end(sessions, checkpoint)


SESSION_BUFFERS_SOURCE = SCRIPTS / "jvm" / "SessionBuffers.scala"


def run_flatmap_sessions(spark: Any, input_dir: Path, checkpoint: Path) -> list[dict]:
    """The sessions workload's state kept by a Scala flatMapGroupsWithState (SessionBuffers.scala,
    on the session's spark.jars)."""
    from pyspark.sql import DataFrame

    sessions = spark._jvm.org.pystatestore.bench.SessionBuffers.sessions(spark._jsparkSession, str(input_dir))
    return run_to_the_end(DataFrame(sessions, spark), checkpoint)


def compile_session_buffers(work: Path) -> Path:
    """SessionBuffers.scala compiled against the running Spark, for the flatmap-sessions workload."""
    import pyspark

    minor = ".".join(pyspark.__version__.split(".")[:2])
    jars_dir = Path(pyspark.__file__).resolve().parent / "jars"
    out = work / f"session-buffers-spark{minor}.jar"
    return build_jar().compile_jar(out, minor, jars_dir=jars_dir, extra_sources=[SESSION_BUFFERS_SOURCE])


# Each takes (spark, input dir, checkpoint) and returns the progress reports of batches with input.
WORKLOADS: dict[str, Callable[[Any, Path, Path], list[dict]]] = {
    "aggregation": run_aggregation,
    "tws": run_tws,
    "sessions": run_sessions,
    "flatmap-sessions": run_flatmap_sessions,
}
WORKLOAD_TEXT = {
    "aggregation": "groupBy(key).agg(count, sum)",
    "tws": "transformWithStateInPandas: per key a count, its events in a ListState, an event-time timer moved "
    "on each input",
    "sessions": f"applyInPandasWithState: per key a count and its newest {SESSION_EVENTS} events of "
    f"{EVENT_BYTES} bytes as a string (about {SESSION_EVENTS * EVENT_BYTES // 1024} KiB of state per key)",
    "flatmap-sessions": f"flatMapGroupsWithState (Scala): per key a count and its newest {SESSION_EVENTS} events of "
    f"{EVENT_BYTES} bytes as a string (about {SESSION_EVENTS * EVENT_BYTES // 1024} KiB of state per key)",
}
