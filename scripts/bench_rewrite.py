"""Benchmark (issue 32): rewriting a checkpoint's state, pystatestore against Spark's own runner.

Workload: a `groupBy("k").agg(count, sum)` aggregation over N distinct keys (default 1M) with
Spark's default 200 shuffle partitions, written in two batches; one checkpoint on Spark's RocksDB
provider, one on pystatestore. Then, each step in a process of its own (and a driver JVM where it
starts Spark), on `local[2]`, in rotating order, `--repeat` times:

- `spark-repartition`: Spark 4.2+'s `spark.streamingCheckpointManager.repartition(ckpt, 50)` of
  the RocksDB checkpoint (in place, on a fresh copy each time; the copy is not timed);
- `pss-repartition`: `pystatestore repartition` of the pystatestore checkpoint to 50 partitions
  (both ends pystatestore: it starts no JVM);
- `pss-migrate`: `pystatestore migrate --to pystatestore` of the RocksDB checkpoint.

Reported: the wall time of each step's process (JVM start included where there is one), median of
the runs, and ratios to Spark's repartition (goals: repartition at most 0.5x, migrate at most 1.0x). Every
result is checked: its offset log names the new provider and partition count, and its state,
read back with Spark's state reader, has every key once with the counts the workload wrote.

    .venv/bin/python scripts/bench_rewrite.py [--keys 1000000] [--partitions 200] [--to-partitions 50]
        [--repeat 3] [--out bench/rewrite-1m-keys-200-to-50-partitions-spark4.3.txt]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
STEPS = ("spark-repartition", "pss-repartition", "pss-migrate")


def session(provider: str, partitions: int) -> Any:
    from pyspark.sql import SparkSession

    import pystatestore

    builder = (
        SparkSession.builder.master("local[2]")
        .config("spark.driver.memory", "2g")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(partitions))
    )
    spark = pystatestore.configure_spark(builder).getOrCreate()
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", provider)
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def build(args: argparse.Namespace) -> None:
    """Child: the workload's checkpoint on one provider."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F

    spark = session(args.provider, args.partitions)
    inp = Path(args.input)
    if not inp.exists():
        inp.mkdir(parents=True)
        half = args.keys // 2
        for i, (lo, hi) in enumerate([(0, half), (half // 2, args.keys)]):  # the second batch updates a quarter
            keys = pa.array([f"key-{k:09d}" for k in range(lo, hi)])
            pq.write_table(pa.table({"k": keys, "v": pa.array(range(lo, hi), pa.int64())}), inp / f"part-{i}.parquet")
            os.utime(inp / f"part-{i}.parquet", (1_700_000_000 + i, 1_700_000_000 + i))
    q = (
        spark.readStream.schema("k string, v long")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(inp))
        .groupBy("k")
        .agg(F.count("*").alias("n"), F.sum("v").alias("total"))
        .writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    spark.stop()


def spark_repartition(args: argparse.Namespace) -> None:
    """Child: Spark's own offline repartitioning (RocksDB provider only)."""
    spark = session(ROCKSDB, args.partitions)
    spark._streamingCheckpointManager.repartition(args.checkpoint, args.to_partitions)
    spark.stop()


def check(args: argparse.Namespace) -> None:
    """Child: the rewritten checkpoint names the new provider and partition count, and its state
    holds every key once with the counts the workload wrote."""
    from pyspark.sql import functions as F

    ckpt = Path(args.checkpoint)
    last = max(int(p.name) for p in (ckpt / "offsets").iterdir() if p.name.isdigit())
    conf = json.loads((ckpt / "offsets" / str(last)).read_text().splitlines()[1])["conf"]
    assert conf["spark.sql.streaming.stateStore.providerClass"] == args.provider, conf
    assert conf["spark.sql.shuffle.partitions"] == str(args.to_partitions), conf
    spark = session(args.provider, args.to_partitions)
    state = spark.read.format("statestore").load(str(ckpt))
    count = state.schema["value"].dataType.fields[0].name  # the count's buffer column (named "count")
    half = args.keys // 2
    want_twice = half - half // 2  # keys of both batches
    got = state.agg(
        F.count("*").alias("rows"),
        F.countDistinct("key.k").alias("keys"),
        F.sum(F.when(F.col("value").getField(count) == 2, 1).otherwise(0)).alias("twice"),
        F.countDistinct("partition_id").alias("partitions"),
    ).first()
    assert (got["rows"], got["keys"], got["twice"]) == (args.keys, args.keys, want_twice), got
    assert got["partitions"] <= args.to_partitions, got
    spark.stop()


def run(cmd: list[str], timeout: int) -> float:
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return time.perf_counter() - started


def child(step: str, **kw: Any) -> list[str]:
    cmd = [sys.executable, __file__, "--child", step]
    for k, v in kw.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    return cmd


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=200)
    ap.add_argument("--to-partitions", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=3600)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--child", choices=["build", "spark-repartition", "check"], help=argparse.SUPPRESS)
    ap.add_argument("--provider", help=argparse.SUPPRESS)
    ap.add_argument("--input", help=argparse.SUPPRESS)
    ap.add_argument("--checkpoint", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        {"build": build, "spark-repartition": spark_repartition, "check": check}[args.child](args)
        return

    import pyspark

    import pystatestore

    work = Path(tempfile.mkdtemp(prefix="bench-rewrite-"))
    started = time.time()
    try:
        sources = {"rocksdb": work / "ckpt-rocksdb", "pystatestore": work / "ckpt-pystatestore"}
        build_s = {}
        for name, ckpt in sources.items():
            provider = ROCKSDB if name == "rocksdb" else pystatestore.PROVIDER_CLASS
            build_s[name] = run(
                child(
                    "build",
                    provider=provider,
                    partitions=args.partitions,
                    keys=args.keys,
                    input=work / "in",
                    checkpoint=ckpt,
                ),
                args.timeout,
            )
        cli = [sys.executable, "-m", "pystatestore.tools.cli"]
        times: dict[str, list[float]] = {s: [] for s in STEPS}
        for r in range(args.repeat):
            for step in STEPS[r % len(STEPS) :] + STEPS[: r % len(STEPS)]:  # rotating order
                out = work / f"out-{step}-{r}"
                if step == "spark-repartition":
                    shutil.copytree(sources["rocksdb"], out)  # Spark's runner writes in place
                    cmd = child(
                        "spark-repartition",
                        checkpoint=out,
                        partitions=args.partitions,
                        to_partitions=args.to_partitions,
                    )
                    provider = ROCKSDB
                elif step == "pss-repartition":
                    cmd = [
                        *cli,
                        "repartition",
                        str(sources["pystatestore"]),
                        "--partitions",
                        str(args.to_partitions),
                        "-o",
                        str(out),
                        "--master",
                        "local[2]",
                    ]
                    provider = pystatestore.PROVIDER_CLASS
                else:
                    cmd = [
                        *cli,
                        "migrate",
                        str(sources["rocksdb"]),
                        "--to",
                        "pystatestore",
                        "-o",
                        str(out),
                        "--master",
                        "local[2]",
                    ]
                    provider = pystatestore.PROVIDER_CLASS
                times[step].append(run(cmd, args.timeout))
                to = args.to_partitions if step != "pss-migrate" else args.partitions
                run(child("check", checkpoint=out, provider=provider, keys=args.keys, to_partitions=to), args.timeout)
                shutil.rmtree(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {s: statistics.median(v) for s, v in times.items()}
    base = med["spark-repartition"]
    lines = [
        f"# pystatestore rewrite benchmark, {dt.date.today()}, Spark {pyspark.__version__}, {platform.node()} "
        f"({os.cpu_count()} cores), local[2]",
        f"# command: .venv/bin/python scripts/bench_rewrite.py --keys {args.keys} --partitions {args.partitions} "
        f"--to-partitions {args.to_partitions} --repeat {args.repeat}   ({(time.time() - started) / 60:.0f} min wall)",
        f"# workload: aggregation, {args.keys:,} keys, {args.partitions} partitions; checkpoints built in "
        f"{build_s['rocksdb']:.0f} s (RocksDB) and {build_s['pystatestore']:.0f} s (pystatestore)",
        "# each step: the wall time of its own process (and driver JVM start where it starts Spark; "
        "pss-repartition starts none), every result checked",
        f"{'step':<20}{'median s':>10}{'min s':>10}{'max s':>10}{'vs Spark':>10}",
    ]
    for s in STEPS:
        v = times[s]
        lines.append(f"{s:<20}{med[s]:>10.1f}{min(v):>10.1f}{max(v):>10.1f}{med[s] / base:>9.2f}x")
    lines.append(
        f"pss-repartition vs spark-repartition: {med['pss-repartition'] / base:.2f}x (goal <= 0.5x); "
        f"pss-migrate (RocksDB -> pystatestore) vs spark-repartition: {med['pss-migrate'] / base:.2f}x (goal <= 1.0x)"
    )
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
