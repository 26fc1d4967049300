"""Streaming counts per key in a driver of its own, set up by hand as a user would (the shim jar,
the provider class, the worker's interpreter), for tests/test_first_error.py. One Spark session;
each line read from stdin is a query to run in it, one after another (a JSON object:
`checkpoint`, and optionally `confs` (the provider's confs for this query only), `partitions`,
`rows` per batch, `batches`, `value_bytes` of a string each key's state keeps, `timeout` in
seconds). For each, one JSON line is printed with what
PySpark shows of the query's failure, if it failed (the error `awaitTermination` raised, and
`query.exception()`), and the seconds it took. A line `{"ready": ...}` comes first, once the
session is up.

    echo '{"checkpoint": "/tmp/ckpt", "partitions": 4}' | \\
        python tests/first_error_query.py [--master local[2]] [--conf KEY=VALUE ...]

The session's confs (`--conf`: spark.local.dir, ...) hold for every query; a query's own confs are
unset again after it, so the next one sees only its own. What caches per JVM (the pool of workers,
a failed start, the work directory) is shared by the queries of one driver: the test decides which
cases may share one. PYTHONPATH is dropped from the JVM's environment (the driver keeps its own
imports): the worker's interpreter sees only what the confs give it, as on an executor host.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import pyspark  # noqa: F401 - imported before PYTHONPATH is dropped, from wherever it points
from pyspark.sql import functions as F

import pystatestore

OUR_PROVIDER = "org.pystatestore.PythonStateStoreProvider"


def run_case(spark: Any, case: dict[str, Any]) -> dict[str, Any] | None:
    """Runs one query to its last batch or its failure; what PySpark showed of the failure, or None."""
    confs: dict[str, str] = case.get("confs", {})
    for key, value in confs.items():
        spark.conf.set(key, value)
    # A new query's shuffle partitions; a restart keeps its checkpoint's.
    spark.conf.set("spark.sql.shuffle.partitions", str(case.get("partitions", 4)))
    try:
        source = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", case.get("rows", 1000)).load()
        if case.get("value_bytes"):  # wide state values: a commit's change frame batch is that much larger
            pad = F.expr(f"repeat('x', {int(case['value_bytes'])})")
            counts = source.withColumn("pad", pad).groupBy("value").agg(F.count("*"), F.max("pad"))
        else:
            counts = source.groupBy("value").count()
        query = (
            counts.writeStream.outputMode("update")
            .format("noop")
            .option("checkpointLocation", case["checkpoint"])
            .trigger(processingTime="0 seconds")
            .start()
        )
        batches = case.get("batches", 2)
        deadline = time.monotonic() + case.get("timeout", 240)
        try:
            while time.monotonic() < deadline:
                progress = query.lastProgress
                if progress is not None and progress["batchId"] >= batches - 1:
                    return None
                if query.awaitTermination(0.5):
                    return None
            return None
        except Exception as e:  # noqa: BLE001 - what PySpark shows is what this reports
            failure = query.exception()
            return {"type": type(e).__name__, "text": str(e), "exception": None if failure is None else str(failure)}
        finally:
            query.stop()
    finally:
        for key in confs:
            spark.conf.unset(key)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="a conf of the session")
    args = ap.parse_args()
    os.environ.pop("PYTHONPATH", None)
    started = time.monotonic()

    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(args.master)
        .appName("pystatestore-first-error")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.jars", pystatestore.jar_path())
        .config("spark.sql.streaming.stateStore.providerClass", OUR_PROVIDER)
    )
    if args.master.startswith("local-cluster"):
        builder = builder.config("spark.executor.memory", "768m")
    for kv in args.conf:
        key, _, value = kv.partition("=")
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    print(json.dumps({"ready": round(time.monotonic() - started, 1)}), flush=True)
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            case_started = time.monotonic()
            error = run_case(spark, json.loads(line))
            print(json.dumps({"error": error, "seconds": round(time.monotonic() - case_started, 1)}), flush=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
