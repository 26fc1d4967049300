"""A streaming count per key in a driver of its own, set up by hand as a user would (the shim jar,
the provider class, the worker's interpreter), for tests/test_first_error.py: prints one JSON line
with what PySpark shows of the query's failure, if it failed (the error `awaitTermination` raised,
and `query.exception()`).

    python tests/first_error_query.py --checkpoint DIR [--master local[2]] [--partitions 200]
        [--rows 1000] [--batches 2] [--conf KEY=VALUE ...]

PYTHONPATH is dropped from the JVM's environment (the driver keeps its own imports): the worker's
interpreter sees only what the confs give it, as on an executor host.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import pyspark  # noqa: F401 - imported before PYTHONPATH is dropped, from wherever it points

import pystatestore

OUR_PROVIDER = "org.pystatestore.PythonStateStoreProvider"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--partitions", type=int, default=200)
    ap.add_argument("--rows", type=int, default=1000, help="rows per batch, each a key of its own")
    ap.add_argument("--batches", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    os.environ.pop("PYTHONPATH", None)

    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(args.master)
        .appName("pystatestore-first-error")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.jars", pystatestore.jar_path())
        .config("spark.sql.streaming.stateStore.providerClass", OUR_PROVIDER)
        .config("spark.sql.shuffle.partitions", str(args.partitions))
    )
    if args.master.startswith("local-cluster"):
        builder = builder.config("spark.executor.memory", "768m")
    for kv in args.conf:
        key, _, value = kv.partition("=")
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    source = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", args.rows).load()
    counts = source.groupBy("value").count()
    query = (
        counts.writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", args.checkpoint)
        .trigger(processingTime="0 seconds")
        .start()
    )
    error = None
    deadline = time.monotonic() + args.timeout
    try:
        while time.monotonic() < deadline:
            progress = query.lastProgress
            if progress is not None and progress["batchId"] >= args.batches - 1:
                break
            if query.awaitTermination(0.5):
                break
    except Exception as e:  # noqa: BLE001 - what PySpark shows is what this reports
        failure = query.exception()
        error = {"type": type(e).__name__, "text": str(e), "exception": None if failure is None else str(failure)}
    finally:
        query.stop()
        spark.stop()
    print(json.dumps({"error": error}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
