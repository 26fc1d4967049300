"""Benchmark: one streaming aggregation, Spark's HDFS and RocksDB providers and pystatestore, in one run.

Workload: a state of N keys (loaded by the first micro-batch), then B micro-batches each updating
X% of the keys (random keys, one file per batch through the file source). Reports, per provider,
the median steady micro-batch time and commit latency, bytes the state store wrote per batch, the
checkpoint size at the end, and the ratios against pystatestore. Then shows where pystatestore's
commit time goes. Timings are medians over the steady batches of one run on this machine.

    .venv/bin/python scripts/bench.py [--keys 100000] [--touched-pct 1] [--batches 20]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import pystatestore

OURS = pystatestore.PROVIDER_CLASS
# name -> (provider class, pystatestore backend or None)
RUNS = {
    "hdfs": ("org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider", None),
    "rocksdb": ("org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider", None),
    "pss-rocksdb": (OURS, "rocksdb"),
    "pss-memory": (OURS, "memory"),
}
BREAKDOWN = [
    ("write changes as an SST file", "pystatestoreApplyMs"),
    ("ingest it into RocksDB", "pystatestoreFlushMs"),
    ("native checkpoint (hard links)", "pystatestoreCheckpointMs"),
    ("upload new files", "pystatestoreUploadMs"),
    ("write manifest", "pystatestoreManifestMs"),
    ("Python worker total", "pystatestoreWorkerCommitMs"),
    ("JVM: write Arrow change frame", "pystatestoreBridgeMs"),
    ("whole commit seen by the task", "pystatestoreCommitMs"),
]
PARTITIONS = 4
WARMUP_BATCHES = 3


def write_inputs(input_dir: Path, keys: int, touched: int, batches: int, seed: int = 42) -> None:
    input_dir.mkdir(parents=True)
    rnd = random.Random(seed)
    for b in range(batches + 1):
        ks = list(range(keys)) if b == 0 else rnd.sample(range(keys), touched)
        table = pa.table({"key": pa.array(ks, pa.int64()), "value": pa.array([rnd.randrange(1000) for _ in ks])})
        path = input_dir / f"batch-{b:04d}.parquet"
        pq.write_table(table, path)
        os.utime(path, (1_700_000_000 + b, 1_700_000_000 + b))  # the file source orders by mtime


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def state_store_bytes(state_dir: Path, since: float) -> int:
    """Bytes of files written under state/ after `since` (excluding Spark's small metadata files)."""
    return sum(
        p.stat().st_size
        for p in state_dir.rglob("*")
        if p.is_file() and p.stat().st_mtime >= since and "_metadata" not in p.parts
    )


def bench_session(app: str, partitions: int = PARTITIONS, **conf: str) -> SparkSession:
    """local[2] with `partitions` shuffle partitions, no UI, and no maintenance during the run, so
    every provider keeps all the files it wrote and checkpoint sizes compare like for like."""
    builder = (
        SparkSession.builder.master("local[2]")
        .appName(app)
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.streaming.stateStore.maintenanceInterval", "600s")
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
    query = (
        agg.writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception():
        raise SystemExit(f"query failed: {query.exception()}")
    return [p for p in query.recentProgress if p["numInputRows"] > 0]


def run_provider(
    spark: SparkSession, name: str, input_dir: Path, work: Path, partitions: int = PARTITIONS
) -> dict[str, float]:
    provider, backend = RUNS[name]
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", provider)
    if backend:
        spark.conf.set("spark.sql.streaming.stateStore.pystatestore.backend", backend)
    checkpoint = work / f"ckpt-{name}"
    started = time.time()
    progress = run_aggregation(spark, input_dir, checkpoint)
    steady = progress[1 + WARMUP_BATCHES :]
    batch_ms = [p["durationMs"]["triggerExecution"] for p in steady]
    commit_ms = [p["stateOperators"][0]["commitTimeMs"] / partitions for p in steady]
    first_steady = dt.datetime.fromisoformat(steady[0]["timestamp"].replace("Z", "+00:00")).timestamp()
    written = state_store_bytes(checkpoint / "state", first_steady - 0.5)
    result = {
        "batch_ms": statistics.median(batch_ms),
        "commit_ms": statistics.median(commit_ms),
        "bytes_per_batch": written / len(steady),
        "checkpoint_bytes": dir_bytes(checkpoint / "state"),
        "state_rows": progress[-1]["stateOperators"][0]["numRowsTotal"],
        "wall_s": time.time() - started,
    }
    if provider == OURS:
        custom = [p["stateOperators"][0]["customMetrics"] for p in steady]
        for _, key in BREAKDOWN:
            result[key] = statistics.median(c.get(key, 0) / partitions for c in custom)
        result["files_uploaded"] = statistics.median(c["pystatestoreFilesUploaded"] for c in custom)
        result["files_reused"] = statistics.median(c["pystatestoreFilesReused"] for c in custom)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--touched-pct", type=float, default=1.0)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--partitions", type=int, default=PARTITIONS, help="shuffle partitions (Spark's default: 200)")
    ap.add_argument("--out", type=Path, default=None, help="also write the report here")
    args = ap.parse_args()
    touched = max(1, int(args.keys * args.touched_pct / 100))
    work = Path(tempfile.mkdtemp(prefix="pss-bench-"))
    write_inputs(work / "input", args.keys, touched, args.batches)

    spark = bench_session("pystatestore-bench", args.partitions)
    results = {name: run_provider(spark, name, work / "input", work, args.partitions) for name in RUNS}
    spark_version = spark.version
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)

    lines = [
        f"# pystatestore bench, {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"# command: .venv/bin/python scripts/bench.py --keys {args.keys} --touched-pct {args.touched_pct} "
        f"--batches {args.batches} --partitions {args.partitions}",
        f"# machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"Spark {spark_version}, local[2], {args.partitions} partitions",
        f"# workload: {args.keys} keys of state, {touched} keys ({args.touched_pct}%) updated per batch, "
        f"{args.batches} batches; medians over batches {WARMUP_BATCHES + 1}..{args.batches}",
        "",
        f"{'run':<14}{'batch ms':>10}{'commit ms/part':>16}{'written/batch':>15}{'checkpoint':>13}{'state rows':>12}",
    ]
    for name, r in results.items():
        lines.append(
            f"{name:<14}{r['batch_ms']:>10.0f}{r['commit_ms']:>16.1f}{r['bytes_per_batch'] / 1024:>12.0f} KiB"
            f"{r['checkpoint_bytes'] / 2**20:>9.1f} MiB{r['state_rows']:>12}"
        )
    lines += ["", "ratios (ours / built-in; < 1 means ours is lower):"]
    for ours_name in ("pss-rocksdb", "pss-memory"):
        ours = results[ours_name]
        for name in ("hdfs", "rocksdb"):
            r = results[name]
            lines.append(
                f"  {ours_name:<12} vs {name:<8} batch time {ours['batch_ms'] / r['batch_ms']:.2f}x   "
                f"commit latency {ours['commit_ms'] / max(r['commit_ms'], 0.1):.2f}x   "
                f"bytes written/batch {ours['bytes_per_batch'] / max(r['bytes_per_batch'], 1):.2f}x   "
                f"checkpoint size {ours['checkpoint_bytes'] / max(r['checkpoint_bytes'], 1):.2f}x"
            )
    ours = results["pss-rocksdb"]
    lines += [
        "",
        "where pss-rocksdb's commit time goes (median per partition per batch, from its custom metrics;",
        f"median files uploaded {ours['files_uploaded']:.0f}, reused {ours['files_reused']:.0f} "
        "per batch over all partitions):",
    ]
    lines += [f"  {label:<34}{ours[key]:>7.1f} ms" for label, key in BREAKDOWN]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)


if __name__ == "__main__":
    sys.exit(main())
