"""A real streaming query on pystatestore, on embedded defaults: local Spark, a local checkpoint.

Counts events per key from Spark's rate source with the provider, prints each micro-batch's
progress (including pystatestore's custom metrics), then stops and restarts the query from the
same checkpoint to show the state coming back through the Python worker.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

import pystatestore

COLUMNS = ("batch", "input rows", "state rows", "commit ms", "py commit ms", "bytes written", "loads via worker")


def print_progress(progress: dict) -> None:
    ops = progress.get("stateOperators") or []
    if not ops:
        return
    op = ops[0]
    m = op.get("customMetrics", {})
    values = (
        progress["batchId"],
        progress["numInputRows"],
        op["numRowsTotal"],
        op["commitTimeMs"],
        m.get("pystatestoreWorkerCommitMs", 0),
        m.get("pystatestoreBytesWritten", 0),
        m.get("pystatestoreLoadsFromWorker", 0),
    )
    print("  ".join(f"{v:>{len(c)}}" for v, c in zip(values, COLUMNS, strict=True)), flush=True)


def stop_between_batches(query: StreamingQuery, timeout_s: float = 120.0) -> None:
    """Stops `query` just after a micro-batch ends. `query.stop()` interrupts a batch in flight, and
    Spark then logs each broadcast it was writing as an ERROR ("Store broadcast ... fail, remove all
    pieces"), which a first-time user reads as a failure. Stopping as a batch ends (its trigger seen
    active, then not) leaves the rest of the trigger interval before the next one starts."""
    deadline = time.monotonic() + timeout_s
    seen_running = False
    while query.isActive and time.monotonic() < deadline:
        running = query.status["isTriggerActive"]
        if seen_running and not running:
            break
        seen_running = seen_running or running
        time.sleep(0.01)
    query.stop()


def run(spark: SparkSession, checkpoint: Path, seconds: float, rate: int, keys: int) -> int:
    events = spark.readStream.format("rate").option("rowsPerSecond", rate).load()
    counts = (
        events.select((F.col("value") % keys).alias("key"), "value")
        .groupBy("key")
        .agg(F.count("*").alias("events"), F.max("value").alias("latest"))
    )
    query = (
        counts.writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="2 seconds")
        .start()
    )
    seen = -1
    deadline = time.time() + seconds
    try:
        while time.time() < deadline and query.isActive:
            time.sleep(0.5)
            for progress in query.recentProgress:
                if progress["batchId"] > seen:
                    seen = progress["batchId"]
                    print_progress(progress)
    finally:
        stop_between_batches(query)
    if query.exception() is not None:
        raise SystemExit(f"query failed: {query.exception()}")
    return seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=30.0, help="run time of each of the two runs")
    ap.add_argument("--rate", type=int, default=5000, help="events per second")
    ap.add_argument("--keys", type=int, default=20000, help="distinct keys (state size)")
    ap.add_argument("--checkpoint", type=Path, default=None, help="checkpoint dir (default: a fresh temp dir)")
    args = ap.parse_args()

    checkpoint = args.checkpoint or Path(tempfile.mkdtemp(prefix="pystatestore-demo-")) / "checkpoint"
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("pystatestore-demo")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
    )
    spark = pystatestore.configure_spark(builder).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    print(f"pystatestore {pystatestore.__version__}: provider {pystatestore.PROVIDER_CLASS}")
    print(f"checkpoint: {checkpoint}\n")
    print("  ".join(COLUMNS))
    last = run(spark, checkpoint, args.seconds, args.rate, args.keys)
    print(
        f"\nstopped after batch {last}; restarting from the same checkpoint "
        "(state reloads from the checkpoint through the Python worker)\n"
    )
    print("  ".join(COLUMNS))
    last_after = run(spark, checkpoint, args.seconds / 2, args.rate, args.keys)
    versions = sorted(int(p.stem) for p in (checkpoint / "state" / "0" / "0" / "manifests").glob("*.json"))
    print(
        f"\nresumed and ran to batch {last_after}. Store state/0/0 holds versions {versions[0]}..{versions[-1]} "
        f"(one manifest each, the commit point of its version)"
    )
    spark.stop()
    if args.checkpoint is None:
        shutil.rmtree(checkpoint.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
