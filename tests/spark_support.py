"""Spark sessions and deterministic streaming runs for the end-to-end tests."""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark import SparkContext
from pyspark.sql import DataFrame, SparkSession

import pystatestore

HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
OUR_PROVIDER = pystatestore.PROVIDER_CLASS
ALL_MASTERS = ["local[2]", "local-cluster[2,1,1024]"]
# scripts/test.sh narrows the other minors' end-to-end runs to local-cluster (separate executor
# JVMs, the case that can differ between minors) to keep CI within its time budget.
MASTERS = os.environ.get("PYSTATESTORE_TEST_MASTERS", " ".join(ALL_MASTERS)).split()
if not MASTERS or set(MASTERS) - set(ALL_MASTERS):
    raise ValueError(f"PYSTATESTORE_TEST_MASTERS={MASTERS!r}: give one or more of {ALL_MASTERS}, space-separated")
# The rocksdb backend's commit modes the end-to-end and GC tests run in. scripts/test.sh narrows the
# other minors to the default (changelog): the modes differ only in the worker's Python, the same on
# every minor, and the default minor runs both.
ALL_COMMIT_MODES = ["changelog", "snapshot"]
COMMIT_MODES = os.environ.get("PYSTATESTORE_TEST_COMMIT_MODES", " ".join(ALL_COMMIT_MODES)).split()
if not COMMIT_MODES or set(COMMIT_MODES) - set(ALL_COMMIT_MODES):
    raise ValueError(
        f"PYSTATESTORE_TEST_COMMIT_MODES={COMMIT_MODES!r}: give one or more of {ALL_COMMIT_MODES}, space-separated"
    )
INPUT_SCHEMA = "id long, key string, value long, ts timestamp"


# Confs earlier sessions of this process set. PySpark launches its JVM once, with the first
# session's confs as Java system properties, and every later SparkConf starts from those: without
# clearing them, one session's confs (a fault rule, localRecovery=false, a tiny GC grace) would
# silently apply to every later session that does not set them itself.
_CONFS_SET: set[str] = set()


def start_session(master: str, app: str = "pystatestore-tests", **conf: str) -> SparkSession:
    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()
    jvm = SparkContext._jvm
    if jvm is not None:
        for key in _CONFS_SET:
            jvm.java.lang.System.clearProperty(key)
    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "3")
        .config("spark.default.parallelism", "2")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.streaming.stateStore.maintenanceInterval", "2s")
        # StateStore.stop() (unload_state_stores) holds the providers' lock while it waits for the
        # maintenance threads, which may be waiting for that lock: seen on 4.2, a 300-s stall (the
        # default) each time, until the wait times out.
        .config("spark.sql.streaming.stateStore.maintenanceShutdownTimeout", "5")
    )
    if master.startswith("local-cluster"):
        builder = builder.config("spark.executor.memory", "768m")
    for k, v in conf.items():
        builder = builder.config(k, v)
    builder = pystatestore.configure_spark(builder)
    _CONFS_SET.update(builder._options)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def write_input_files(
    input_dir: Path, first_file: int, count: int, *, rows: int = 120, keys: int = 15, seed: int = 7
) -> None:
    """Deterministic event files: file i holds events with event time around i * 10 s."""
    input_dir.mkdir(parents=True, exist_ok=True)
    for i in range(first_file, first_file + count):
        rnd = random.Random(seed * 1000 + i)
        lines = []
        for j in range(rows):
            key = f"k{rnd.randrange(keys) + (i // 3) * 5}"  # keys drift, so some go quiet and time out
            lines.append(
                json.dumps(
                    {
                        "id": rnd.randrange(rows * 4),
                        "key": key,
                        "value": rnd.randrange(100),
                        "ts": f"2026-01-01 00:{(i * 10 + j % 10) // 60:02d}:{(i * 10 + j % 10) % 60:02d}",
                    }
                )
            )
        tmp = input_dir / f".f{i:04d}.json.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        # The file source orders files by mtime; equal mtimes would make batch contents random.
        os.utime(tmp, (1_700_000_000 + i, 1_700_000_000 + i))
        tmp.rename(input_dir / f"f{i:04d}.json")


def unload_state_stores(spark: SparkSession) -> None:
    """Unloads every loaded state store provider and stops Spark's maintenance thread (the next query
    starts it again), so nothing writes to a stopped query's checkpoint any more. Only for local
    masters, where the executors' StateStore registry lives in the driver JVM."""
    assert spark.sparkContext.master.startswith("local["), spark.sparkContext.master
    spark._jvm.org.apache.spark.sql.execution.streaming.state.StateStore.stop()  # type: ignore[union-attr]


def run_phase(
    spark: SparkSession,
    build: Callable[[DataFrame], DataFrame],
    *,
    provider: str,
    input_dir: Path,
    checkpoint: Path,
    output_mode: str,
    results: dict[int, list[tuple]],
) -> list[dict]:
    """Runs the query over everything available (one file per micro-batch), stops it, and returns
    its progress reports."""
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", provider)
    source = spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1).json(str(input_dir))

    def collect(batch: DataFrame, batch_id: int) -> None:
        results[batch_id] = sorted(tuple(r) for r in batch.collect())

    query = (
        build(source)
        .writeStream.outputMode(output_mode)
        .foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(600)
    if query.exception() is not None:
        raise AssertionError(f"query failed: {query.exception()}")
    return list(query.recentProgress)


def run_with_restart(
    spark: SparkSession,
    build: Callable[[DataFrame], DataFrame],
    *,
    provider: str,
    workdir: Path,
    output_mode: str,
    files_per_phase: int = 3,
    before_phase: Callable[[int], None] | None = None,
    all_progress: bool = False,
) -> tuple[dict[int, list[tuple]], Any]:
    """Two phases on one checkpoint: run, stop, add input, restart. Returns all batch outputs and
    the last progress report (or, with `all_progress`, every report of both phases)."""
    name = provider.rsplit(".", 1)[-1]
    input_dir, checkpoint = workdir / f"in-{name}", workdir / f"ckpt-{name}"
    shutil.rmtree(input_dir, ignore_errors=True)
    shutil.rmtree(checkpoint, ignore_errors=True)
    results: dict[int, list[tuple]] = {}
    progress: list[dict] = []
    for phase in range(2):
        write_input_files(input_dir, phase * files_per_phase, files_per_phase)
        if before_phase is not None:
            before_phase(phase)
        progress += run_phase(
            spark,
            build,
            provider=provider,
            input_dir=input_dir,
            checkpoint=checkpoint,
            output_mode=output_mode,
            results=results,
        )
    return results, (progress if all_progress else progress[-1])
