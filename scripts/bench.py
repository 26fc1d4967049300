"""Benchmark: one streaming aggregation on Spark's HDFS and RocksDB providers (with and without
changelog checkpointing) and on pystatestore (changelog and snapshot commits), in one run.

Workload: a state of N keys (loaded by the first micro-batch), then B micro-batches each updating
X% of the keys (random keys, one file per batch through the file source), with Spark's retention
(minBatchesToRetain=5) and maintenance every 2 s for every provider, as a user runs them. Reported
per provider: the median steady micro-batch time and commit latency (p50 per partition), bytes the
state store wrote per steady batch (every file that appeared, seen by a watcher), the checkpoint's
file count and bytes at the end, and the restart batch (median of three: each a new query in a new
JVM on the checkpoint with one more input file), with where it restored its state from and how many
changelog versions pystatestore replayed. Ratios are against pystatestore's default (changelog) mode.

Like with like: every query runs in a JVM of its own (a provider never inherits another's warm JIT,
page cache of its own files, or loaded state), and with --repeat R the providers run R times in
rotating order (repeat i starts i providers later), so no provider always goes first or last; the
report gives the median over repeats and each figure's range. A restart in a new JVM is a driver
restart on the same host: Spark's providers load from the checkpoint (their local working copies
live in the dead JVM's temporary directory); pystatestore restores from its local recovery copies
when they are intact, and the report says how many bytes came from each.

    .venv/bin/python scripts/bench.py [--keys 100000] [--touched-pct 1] [--batches 20] [--partitions 4]
                                      [--repeat 3] [--pyspark 4.1|4.2|4.3]
                                      [--workload aggregation|tws|sessions|flatmap-sessions]
                                      [--runs NAME,...] [--out FILE]

--workload tws (Spark 4.1: 4.2+ refuse transformWithState on any provider but their RocksDB one) runs
a transformWithStateInPandas session buffer instead: per key a count (ValueState), its events
(ListState, appended to) and an event-time timer an hour after the key's newest event (moved on each
input: the timer and its ValueState), with a watermark on the events' time; Spark's HDFS provider
has no column families and sits out.

--workload sessions runs applyInPandasWithState keeping a session's event buffer per key: a count and
its newest 64 events of 64 bytes each as one string, about 4 KiB of state per key (a new key starts
from 64 events of history), rewritten whenever the key has input: the large-value case.
--workload flatmap-sessions keeps the same state with a Scala flatMapGroupsWithState
(scripts/jvm/SessionBuffers.scala, compiled with the running Spark's own Scala compiler): the same
case with no Python UDF workers, so the state store's share of a batch shows.

--pyspark runs the whole benchmark on that Spark minor (its pyspark, installed once per machine by
scripts/build_jar.py, and our jar for it) against that minor's own built-in providers.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import pystatestore
from pystatestore.spark_minors import BUILT_AGAINST

OURS = pystatestore.PROVIDER_CLASS
HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
CHANGELOG_CONF = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
PSS = "spark.sql.streaming.stateStore.pystatestore."
FORMAT_CONF = "spark.sql.streaming.stateStore.checkpointFormatVersion"
# name -> (provider class, session confs for the run)
RUNS = {
    "hdfs": (HDFS, {}),
    "rocksdb": (ROCKSDB, {CHANGELOG_CONF: "false"}),
    "rocksdb-changelog": (ROCKSDB, {CHANGELOG_CONF: "true"}),
    "pss-changelog": (OURS, {PSS + "commitMode": "changelog"}),
    "pss-snapshot": (OURS, {PSS + "commitMode": "snapshot"}),
    "pss-applied-first": (OURS, {PSS + "commitMode": "changelog", PSS + "durableFirstCommit": "false"}),
}
# What each run commits, so that no figure is read as another mode's.
COMMIT_MODE = {
    "hdfs": "Spark HDFS: a delta file per commit, snapshots by maintenance",
    "rocksdb": "Spark RocksDB: a full checkpoint (zip + new SST files) per commit",
    "rocksdb-changelog": "Spark RocksDB, changelogCheckpointing.enabled=true: a changelog file per commit",
    "pss-changelog": "pystatestore commitMode=changelog (its default): changes per commit, snapshots when due",
    "pss-snapshot": "pystatestore commitMode=snapshot: an incremental snapshot (new SST files) per commit",
    "pss-applied-first": "pystatestore changelog, durableFirstCommit=false: the local DB and view before the reply",
}
OUR_RUNS = ("pss-changelog", "pss-snapshot", "pss-applied-first")
# Durable first (decision 0032), the SST, ingest and checkpoint come after the worker's reply, and
# the next batch's first read of the store waits for them if they are not done; otherwise (snapshot
# mode, durableFirstCommit=false) they are part of the commit and the segment is written with the SST.
BREAKDOWN = [
    ("write the changes as a segment", "pystatestoreSegmentMs"),
    ("upload new files", "pystatestoreUploadMs"),
    ("write manifest", "pystatestoreManifestMs"),
    ("Python worker total, until its reply", "pystatestoreWorkerCommitMs"),
    ("the call to the worker, seen by the JVM", "pystatestoreWorkerCallMs"),
    ("JVM: write Arrow change frame", "pystatestoreBridgeMs"),
    ("JVM after the reply (cache, coordinator)", "pystatestoreJvmAfterReplyMs"),
    ("whole commit seen by the task", "pystatestoreCommitMs"),
    ("SST of the changes (+segment if not durable first)", "pystatestoreApplyMs"),
    ("ingest it into RocksDB", "pystatestoreFlushMs"),
    ("native checkpoint (the read view)", "pystatestoreCheckpointMs"),
    ("worker time after the reply (durable first)", "pystatestoreDeferredApplyMs"),
    ("next batch's reads waiting for that view", "pystatestoreViewWaitMs"),
]
# pystatestore's metrics of a restart batch: where its state came from
RESTORE_METRICS = {
    "replayed_versions": "pystatestoreRestoreChangelogVersions",
    "restore_local_bytes": "pystatestoreRestoreLocalBytes",
    "restore_remote_bytes": "pystatestoreRestoreRemoteBytes",
    "restore_remote_files": "pystatestoreRestoreRemoteFiles",
    "restore_worker_ms": "pystatestoreRestoreMs",
}
PARTITIONS = 4
WARMUP_BATCHES = 3
RESTARTS = 3
RETAIN = 5


def write_inputs(input_dir: Path, keys: int, touched: int, batches: int, seed: int = 42) -> None:
    """Batch b's file, and (in restart-input/) the restarts' files: batch 1 + i's keys and values,
    with event times after every batch's (the tws workload's watermark would drop older ones)."""
    input_dir.mkdir(parents=True)
    restarts = input_dir.parent / "restart-input"
    restarts.mkdir()
    rnd = random.Random(seed)
    for b in range(batches + 1):
        ks = list(range(keys)) if b == 0 else rnd.sample(range(keys), touched)
        values = [rnd.randrange(1000) for _ in ks]
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
    os.utime(path, (1_700_000_000 + second, 1_700_000_000 + second))  # the file source orders by mtime


def state_files(state_dir: Path) -> dict[str, int]:
    """Every file of the state stores (Spark's small _metadata files excluded): path -> size."""
    out = {}
    for p in state_dir.rglob("*"):
        try:
            if p.is_file() and "_metadata" not in p.parts:
                out[str(p)] = p.stat().st_size
        except FileNotFoundError:  # deleted by maintenance while we looked
            continue
    return out


class FileWatcher(threading.Thread):
    """Notes every file that appears under `root` (and its largest size), every 0.2 s, so bytes
    written count files that maintenance deletes later in the run."""

    def __init__(self, root: Path) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.first_seen: dict[str, tuple[float, int]] = {}
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(0.2):
            self.scan()

    def scan(self) -> None:
        if not self.root.exists():
            return
        now = time.time()
        for path, size in state_files(self.root).items():
            seen, biggest = self.first_seen.get(path, (now, 0))
            self.first_seen[path] = (seen, max(biggest, size))

    def stop(self) -> None:
        self._done.set()
        self.join()
        self.scan()

    def bytes_since(self, since: float) -> int:
        return sum(size for seen, size in self.first_seen.values() if seen >= since)


def bench_session(app: str, partitions: int = PARTITIONS, **conf: str) -> SparkSession:
    """local[2] with `partitions` shuffle partitions, no UI, Spark's retention at 5 batches and
    maintenance every 2 s, for every provider."""
    builder = (
        SparkSession.builder.master("local[2]")
        .appName(app)
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.streaming.stateStore.maintenanceInterval", "2s")
        .config("spark.sql.streaming.minBatchesToRetain", str(RETAIN))
        .config("spark.pyspark.python", sys.executable)  # the tws workload's Python workers need pandas
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = pystatestore.configure_spark(builder).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run_aggregation(spark: SparkSession, input_dir: Path, checkpoint: Path) -> list[dict]:
    """Counts and sums per key over everything available, one file per batch; returns the progress
    reports of batches that had input."""
    source = spark.readStream.schema("key long, value long").option("maxFilesPerTrigger", 1).parquet(str(input_dir))
    agg = source.groupBy("key").agg(F.count("*").alias("n"), F.sum("value").alias("total"))
    return run_to_the_end(agg, checkpoint)


def run_to_the_end(result: DataFrame, checkpoint: Path) -> list[dict]:
    """`result` written to the noop sink in update mode until its input is processed; the progress
    reports of batches that had input."""
    query = (
        result.writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception():
        raise SystemExit(f"query failed: {query.exception()}")
    return [p for p in query.recentProgress if p["numInputRows"] > 0]


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


def run_tws(spark: SparkSession, input_dir: Path, checkpoint: Path) -> list[dict]:
    """The session buffer over everything available, one file per batch; returns the progress
    reports of batches that had input."""
    source = (
        spark.readStream.schema("key long, value long, ts timestamp")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(input_dir))
    )
    buffered = (
        source.withWatermark("ts", "10 seconds")
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


def run_sessions(spark: SparkSession, input_dir: Path, checkpoint: Path) -> list[dict]:
    """applyInPandasWithState keeping each key's newest events (about 4 KiB), one file per batch;
    returns the progress reports of batches that had input."""
    source = (
        spark.readStream.schema("key long, value long, ts timestamp")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(input_dir))
    )
    sessions = source.groupBy("key").applyInPandasWithState(
        session_buffer, "key long, n long", "n long, events string", "update", "NoTimeout"
    )
    return run_to_the_end(sessions, checkpoint)


SESSION_BUFFERS_SOURCE = Path(__file__).resolve().parent / "jvm" / "SessionBuffers.scala"


def run_flatmap_sessions(spark: SparkSession, input_dir: Path, checkpoint: Path) -> list[dict]:
    """The sessions workload's state kept by a Scala flatMapGroupsWithState (SessionBuffers.scala,
    on the session's spark.jars); returns the progress reports of batches that had input."""
    sessions = spark._jvm.org.pystatestore.bench.SessionBuffers.sessions(spark._jsparkSession, str(input_dir))
    return run_to_the_end(DataFrame(sessions, spark), checkpoint)


def compile_session_buffers(work: Path) -> Path:
    """SessionBuffers.scala compiled against the running Spark, for the flatmap-sessions workload."""
    import pyspark

    minor = ".".join(pyspark.__version__.split(".")[:2])
    jars_dir = Path(pyspark.__file__).resolve().parent / "jars"
    out = work / f"session-buffers-spark{minor}.jar"
    return build_jar_module().compile_jar(out, minor, jars_dir=jars_dir, extra_sources=[SESSION_BUFFERS_SOURCE])


WORKLOADS = {
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


def query_child(spec_file: Path) -> None:
    """The child: one query in this JVM, as `spec_file` says; writes its progress reports (batches
    with input) and Spark's version next to the spec. Lingers after the query so that maintenance
    catches up, as it would in a running query."""
    spec = json.loads(spec_file.read_text())
    os.environ["PYSPARK_PYTHON"] = sys.executable  # a transformWithState processor's init runs in it
    spark = bench_session(spec["app"], spec["partitions"], **spec["session_conf"])
    for key, value in spec["sql_conf"].items():
        spark.conf.set(key, value)
    progress = WORKLOADS[spec["workload"]](spark, Path(spec["input"]), Path(spec["checkpoint"]))
    time.sleep(spec["linger_s"])
    Path(spec["result"]).write_text(
        json.dumps({"progress": [json.loads(p.json) for p in progress], "spark": spark.version})
    )
    spark.stop()


def run_query_in_own_jvm(
    work: Path,
    tag: str,
    sql_conf: dict[str, str],
    input_dir: Path,
    checkpoint: Path,
    *,
    partitions: int = PARTITIONS,
    linger_s: float = 0.0,
    session_conf: dict[str, str] | None = None,
    workload: str = "aggregation",
) -> tuple[list[dict], str]:
    """Runs the aggregation over everything in `input_dir` with `sql_conf` (the provider class and
    its confs) in a new driver JVM (a new Python process and its SparkSession); returns the progress
    reports of batches with input and Spark's version."""
    spec_file, result = work / f"{tag}.spec.json", work / f"{tag}.result.json"
    spec = {
        "app": f"pystatestore-bench-{tag}",
        "partitions": partitions,
        "session_conf": session_conf or {},
        "sql_conf": sql_conf,
        "input": str(input_dir),
        "checkpoint": str(checkpoint),
        "linger_s": linger_s,
        "result": str(result),
        "workload": workload,
    }
    spec_file.write_text(json.dumps(spec))
    log = work / f"{tag}.log"
    with open(log, "w") as out:
        code = subprocess.run(
            [sys.executable, __file__, "--child", str(spec_file)], stdout=out, stderr=subprocess.STDOUT
        ).returncode
    if code != 0 or not result.exists():
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"bench: the {tag} query's JVM failed (exit {code}); the end of its log {log}:\n{tail}")
    data = json.loads(result.read_text())
    return data["progress"], data["spark"]


def commit_floor_ms(size: int, directory: Path, writes: int = 200) -> float:
    """The physical floor of a commit that writes `size` bytes: p50 of writing a new file of that
    size in `directory` (the checkpoint's disk) and fsyncing it, measured here and now."""
    data = os.urandom(max(int(size), 1))
    times = []
    for i in range(writes):
        path = directory / f"floor-{i}"
        started = time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        times.append((time.perf_counter() - started) * 1000)
        path.unlink()
    return statistics.median(times)


def custom_metric(report: dict, key: str, default: float = -1) -> float:
    return report["stateOperators"][0].get("customMetrics", {}).get(key, default)


def run_provider(
    name: str,
    input_dir: Path,
    work: Path,
    repeat: int,
    partitions: int = PARTITIONS,
    checkpoint_format: int = 1,
    workload: str = "aggregation",
    restarts: int = RESTARTS,
    session_conf: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One provider's load, steady batches and restarts on a fresh checkpoint, each query in its own JVM."""
    provider, confs = RUNS[name]
    confs = {**confs, FORMAT_CONF: str(checkpoint_format)}
    tag = f"{name}-r{repeat}"
    checkpoint = work / f"ckpt-{tag}"
    restart_input = work / f"input-{tag}"
    shutil.copytree(input_dir, restart_input)
    # Our local recovery copies for this run only, so that the next run starts without them.
    local = {PSS + "localRecoveryDir": str(work / f"recovery-{tag}")} if provider == OURS else {}
    sql_conf = {"spark.sql.streaming.stateStore.providerClass": provider, **confs, **local}
    watcher = FileWatcher(checkpoint / "state")
    watcher.start()
    started = time.time()
    try:
        progress, spark_version = run_query_in_own_jvm(
            work,
            tag,
            sql_conf,
            restart_input,
            checkpoint,
            partitions=partitions,
            linger_s=5.0,
            workload=workload,
            session_conf=session_conf,
        )
    finally:
        watcher.stop()
    files = state_files(checkpoint / "state")
    steady = progress[1 + WARMUP_BATCHES :]
    batch_ms = [p["durationMs"]["triggerExecution"] for p in steady]
    commit_ms = [p["stateOperators"][0]["commitTimeMs"] / partitions for p in steady]
    first_steady = dt.datetime.fromisoformat(steady[0]["timestamp"].replace("Z", "+00:00")).timestamp()
    result: dict[str, Any] = {
        "spark": spark_version,
        "batch_ms": statistics.median(batch_ms),
        "commit_ms": statistics.median(commit_ms),
        "bytes_per_batch": watcher.bytes_since(first_steady - 0.5) / len(steady),
        "checkpoint_bytes": sum(files.values()),
        "checkpoint_files": len(files),
        "state_rows": progress[-1]["stateOperators"][0]["numRowsTotal"],
        "wall_s": time.time() - started,
    }
    if provider == OURS:
        for _, key in BREAKDOWN:
            result[key] = statistics.median(max(custom_metric(p, key, 0), 0) / partitions for p in steady)
        result["files_uploaded"] = statistics.median(custom_metric(p, "pystatestoreFilesUploaded", 0) for p in steady)
        result["files_inline"] = statistics.median(custom_metric(p, "pystatestoreFilesInline", 0) for p in steady)
        # What one partition's commit writes (its changes, inline or in a file, and its manifest).
        result["commit_bytes"] = statistics.median(
            max(custom_metric(p, "pystatestoreBytesWritten", 0), 0) / partitions for p in steady
        )
    # The restarts: each a new query in a new JVM on the same checkpoint processes one more file; its
    # first batch rebuilds every partition's state. One restart batch varied by ±20% between runs,
    # so the report takes the median of `restarts` of them (RESTARTS by default).
    restart_reports = []
    for i in range(restarts):
        target = restart_input / f"batch-restart-{i}.parquet"
        shutil.copy(input_dir.parent / "restart-input" / target.name, target)
        os.utime(target, (1_800_000_000 + 10 * i, 1_800_000_000 + 10 * i))
        first = run_query_in_own_jvm(
            work,
            f"{tag}-restart{i}",
            sql_conf,
            restart_input,
            checkpoint,
            partitions=partitions,
            workload=workload,
            session_conf=session_conf,
        )[0][0]
        restart_reports.append(first)
    result["restart_ms"] = statistics.median(r["durationMs"]["triggerExecution"] for r in restart_reports)
    for key, metric in RESTORE_METRICS.items():
        result[key] = statistics.median(custom_metric(r, metric) for r in restart_reports)
    shutil.rmtree(checkpoint, ignore_errors=True)
    shutil.rmtree(restart_input, ignore_errors=True)
    shutil.rmtree(work / f"recovery-{tag}", ignore_errors=True)
    return result


def restored_from(name: str, r: dict[str, Any]) -> str:
    """Where a restart batch's state came from, in a few words."""
    if RUNS[name][0] != OURS:
        return "checkpoint (new JVM)"
    return (
        f"local {r['restore_local_bytes'] / 1024:.0f} KiB, ckpt {r['restore_remote_bytes'] / 1024:.0f} KiB, "
        f"worker {r['restore_worker_ms']:.0f} ms"
    )


def build_jar_module():  # noqa: ANN201 - scripts/build_jar.py, loaded by path
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_jar", Path(__file__).resolve().parent / "build_jar.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def median_of_repeats(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the repeats of one provider, and (key + '_range') its min and max."""
    out: dict[str, Any] = {"spark": runs[0]["spark"], "repeats": len(runs)}
    for key, value in runs[0].items():
        if isinstance(value, (int, float)):
            values = [r[key] for r in runs]
            out[key] = statistics.median(values)
            out[key + "_range"] = (min(values), max(values))
    return out


def spread(r: dict[str, Any], key: str, fmt: str) -> str:
    low, high = r[key + "_range"]
    return f"{format(low, fmt)}-{format(high, fmt)}" if r["repeats"] > 1 else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--touched-pct", type=float, default=1.0)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--partitions", type=int, default=PARTITIONS, help="shuffle partitions (Spark's default: 200)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of every provider, in rotating order")
    ap.add_argument(
        "--restarts", type=int, choices=range(1, RESTARTS + 1), default=RESTARTS, help="restarts per run (median)"
    )
    ap.add_argument("--out", type=Path, default=None, help="also write the report here")
    ap.add_argument("--pyspark", choices=list(BUILT_AGAINST), help="the Spark minor to run (default: the venv's)")
    ap.add_argument(
        "--checkpoint-format",
        type=int,
        choices=(1, 2),
        default=1,
        help="Spark's state checkpoint format (2: checkpoint ids; Spark's HDFS provider has none, so it sits out)",
    )
    ap.add_argument(
        "--workload",
        choices=list(WORKLOADS),
        default="aggregation",
        help="tws: a transformWithStateInPandas session buffer (ListState, a ValueState, event-time timers); 4.1 "
        "only. sessions: applyInPandasWithState keeping about 4 KiB of events per key (large values); "
        "flatmap-sessions: the same state kept by a Scala flatMapGroupsWithState",
    )
    ap.add_argument(
        "--runs",
        default=None,
        help=f"comma-separated runs to compare (default: every one the workload and format allow): {', '.join(RUNS)}",
    )
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        query_child(args.child)
        return
    if args.pyspark:
        build_jar_module().reexec_under_pyspark(args.pyspark)
    touched = max(1, int(args.keys * args.touched_pct / 100))
    work = Path(tempfile.mkdtemp(prefix="pss-bench-"))
    write_inputs(work / "input", args.keys, touched, args.batches)
    session_conf = {"spark.jars": str(compile_session_buffers(work))} if args.workload == "flatmap-sessions" else None

    # Spark's HDFS provider has no checkpoint ids (format 2) and no column families (transformWithState).
    names = [n for n in RUNS if (args.checkpoint_format == 1 and args.workload != "tws") or RUNS[n][0] != HDFS]
    if args.runs:
        asked = args.runs.split(",")
        if unknown := [n for n in asked if n not in names]:
            raise SystemExit(f"bench: --runs {','.join(unknown)}: not among {', '.join(names)} for this workload")
        names = [n for n in names if n in asked]
    per_run: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    orders = []
    for repeat in range(args.repeat):
        # offsets spread over the list (5 runs, 3 repeats: 0, 1, 3), so each run goes early and late
        offset = repeat * len(names) // args.repeat
        order = names[offset:] + names[:offset]
        orders.append(order)
        for name in order:
            print(f"bench: repeat {repeat + 1}/{args.repeat}: {name}", flush=True)
            per_run[name].append(
                run_provider(
                    name,
                    work / "input",
                    work,
                    repeat,
                    args.partitions,
                    args.checkpoint_format,
                    args.workload,
                    args.restarts,
                    session_conf,
                )
            )
    results = {name: median_of_repeats(runs) for name, runs in per_run.items()}
    floors = {name: commit_floor_ms(results[name]["commit_bytes"], work) for name in OUR_RUNS if name in results}
    shutil.rmtree(work, ignore_errors=True)
    spark_version = results[names[0]]["spark"]

    command = (
        f".venv/bin/python scripts/bench.py --keys {args.keys} --touched-pct {args.touched_pct} "
        f"--batches {args.batches} --partitions {args.partitions} --repeat {args.repeat}"
        + (f" --pyspark {args.pyspark}" if args.pyspark else "")
        + (f" --checkpoint-format {args.checkpoint_format}" if args.checkpoint_format != 1 else "")
        + (f" --workload {args.workload}" if args.workload != "aggregation" else "")
        + (f" --runs {args.runs}" if args.runs else "")
        + (f" --restarts {args.restarts}" if args.restarts != RESTARTS else "")
    )
    lines = [
        f"# pystatestore bench, {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"# command: {command}",
        f"# machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"Spark {spark_version}, local[2], {args.partitions} partitions, minBatchesToRetain={RETAIN}, "
        f"maintenance every 2 s, checkpointFormatVersion={args.checkpoint_format}",
        f"# workload: {WORKLOAD_TEXT[args.workload]}; {args.keys} keys of state, {touched} keys ({args.touched_pct}%) "
        "updated per batch, "
        f"{args.batches} batches; medians over batches {WARMUP_BATCHES + 1}..{args.batches}; then "
        f"{args.restarts} restarts (median), each a new query in a new JVM",
        f"# every query in a JVM of its own; {args.repeat} repeats in rotating order ("
        + "; ".join(", ".join(order) for order in orders)
        + "); figures are medians over the repeats",
        "",
        "runs:",
        *(f"  {name:<19}{COMMIT_MODE[name]}" for name in names),
        "",
        f"{'run':<19}{'batch ms':>9}{'commit p50':>11}{'written/batch':>15}{'ckpt files':>11}{'ckpt size':>11}"
        f"{'restart ms':>11}{'replayed':>9}  restored from",
    ]
    for name, r in results.items():
        replayed = f"{r['replayed_versions']:>9.0f}" if r["replayed_versions"] >= 0 else f"{'-':>9}"
        lines.append(
            f"{name:<19}{r['batch_ms']:>9.0f}{r['commit_ms']:>9.1f}ms{r['bytes_per_batch'] / 1024:>11.1f} KiB"
            f"{r['checkpoint_files']:>11.0f}{r['checkpoint_bytes'] / 2**20:>7.1f} MiB{r['restart_ms']:>11.0f}{replayed}"
            f"  {restored_from(name, r)}"
        )
    lines += [
        "",
        "(commit p50: per partition per batch; replayed: changelog versions pystatestore replayed on top of",
        "snapshots to rebuild all partitions in a restart batch; restart ms, replayed and restored bytes: medians",
        f"of {args.restarts} restarts; Spark's providers restore from the checkpoint, their local copies died with",
        "the JVM; ours from the local recovery copies on this host, and the checkpoint for anything they lack;",
        "worker: the time our workers spent restoring, all partitions together; the rest of a restart batch is",
        "a new JVM's first batch)",
        "",
        f"range over the {args.repeat} repeats (min-max):",
        f"{'run':<19}{'batch ms':>14}{'commit p50 ms':>16}{'restart ms':>14}",
    ]
    for name, r in results.items():
        lines.append(
            f"{name:<19}{spread(r, 'batch_ms', '.0f'):>14}{spread(r, 'commit_ms', '.1f'):>16}"
            f"{spread(r, 'restart_ms', '.0f'):>14}"
        )
    lines += ["", "ratios (ours / built-in; < 1 means ours is lower):"]
    for ours_name in [n for n in OUR_RUNS if n in results]:
        ours = results[ours_name]
        for name in [n for n in ("hdfs", "rocksdb", "rocksdb-changelog") if n in results]:
            r = results[name]
            lines.append(
                f"  {ours_name:<13} vs {name:<17} batch {ours['batch_ms'] / r['batch_ms']:.2f}x  "
                f"commit p50 {ours['commit_ms'] / max(r['commit_ms'], 0.1):.2f}x  "
                f"written/batch {ours['bytes_per_batch'] / max(r['bytes_per_batch'], 1):.2f}x  "
                f"files {ours['checkpoint_files'] / max(r['checkpoint_files'], 1):.2f}x  "
                f"bytes {ours['checkpoint_bytes'] / max(r['checkpoint_bytes'], 1):.2f}x  "
                f"restart {ours['restart_ms'] / max(r['restart_ms'], 1):.2f}x"
            )
    for ours_name in [n for n in OUR_RUNS if n in results]:
        ours = results[ours_name]
        lines += [
            "",
            f"where {ours_name}'s commit time goes (median per partition per batch, from its custom metrics;",
            f"median files uploaded {ours['files_uploaded']:.0f}, stored inline {ours['files_inline']:.0f} "
            "per batch over all partitions):",
        ]
        lines += [f"  {label:<40}{ours[key]:>7.1f} ms" for label, key in BREAKDOWN]
        lines.append(
            f"  the floor: write + fsync of {ours['commit_bytes']:,.0f} bytes (what a commit wrote, median) on the "
            f"checkpoint's disk, p50 of 200: {floors[ours_name]:.2f} ms; ours is "
            f"{ours['commit_ms'] / max(floors[ours_name], 0.001):.1f}x it"
        )
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)


if __name__ == "__main__":
    sys.exit(main())
