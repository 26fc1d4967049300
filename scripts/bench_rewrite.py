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
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib.child import hidden_options, run_child, script_argv
from benchlib.inputs import stamp_order
from benchlib.providers import PROVIDERS, sql_conf
from benchlib.repeats import rotation
from benchlib.report import code_version, provenance, watching_load, write_report

STEPS = ["spark-repartition", "pss-repartition", "pss-migrate"]
# benchlib.providers' names: the checkpoints' providers, Spark's RocksDB (which its runner rewrites) and ours
ROCKSDB, OURS = "rocksdb", "pss-changelog"


def session(provider: str, partitions: int) -> Any:
    from benchlib.session import start_session

    return start_session(
        f"bench-rewrite-{provider}", partitions=partitions, sql_conf=sql_conf(provider), **{"spark.driver.memory": "2g"}
    )


def build(args: argparse.Namespace) -> None:
    """Child: the workload's checkpoint on one provider."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F

    from benchlib.session import start_noop

    spark = session(args.provider, args.partitions)
    inp = Path(args.input)
    if not inp.exists():
        inp.mkdir(parents=True)
        half = args.keys // 2
        for i, (lo, hi) in enumerate([(0, half), (half // 2, args.keys)]):  # the second batch updates a quarter
            keys = pa.array([f"key-{k:09d}" for k in range(lo, hi)])
            pq.write_table(pa.table({"k": keys, "v": pa.array(range(lo, hi), pa.int64())}), inp / f"part-{i}.parquet")
            stamp_order(inp / f"part-{i}.parquet", i)
    counts = (
        spark.readStream.schema("k string, v long")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(inp))
        .groupBy("k")
        .agg(F.count("*").alias("n"), F.sum("v").alias("total"))
    )
    start_noop(counts, args.checkpoint).awaitTermination()
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
    assert conf["spark.sql.streaming.stateStore.providerClass"] == PROVIDERS[args.provider].cls, conf
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


def run(argv: list[str], timeout: int) -> float:
    """The wall time of `python argv...` (its process, and its driver JVM where it starts Spark)."""
    done = run_child(argv, timeout=timeout)
    if done.timed_out or done.returncode != 0:
        why = f"no end within {timeout} s" if done.timed_out else f"exit {done.returncode}"
        raise SystemExit(f"failed ({why}): {' '.join(argv)}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.seconds


def child(step: str, **kw: Any) -> list[str]:
    return script_argv(__file__, child=step, **kw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=200)
    ap.add_argument("--to-partitions", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=3600)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--child", choices=["build", "spark-repartition", "check"], help=argparse.SUPPRESS)
    hidden_options(ap, "--provider", "--input", "--checkpoint")
    args = ap.parse_args()
    if args.child:
        {"build": build, "spark-repartition": spark_repartition, "check": check}[args.child](args)
        return

    import pyspark

    code = code_version()
    work = Path(tempfile.mkdtemp(prefix="bench-rewrite-"))
    started = time.time()
    sources = {ROCKSDB: work / "ckpt-rocksdb", OURS: work / "ckpt-pystatestore"}
    cli = ["-m", "pystatestore.tools.cli"]
    try:
        with watching_load() as load:
            build_s = {}
            for provider, ckpt in sources.items():
                load.phase = f"{provider} build"
                argv = child(
                    "build",
                    provider=provider,
                    partitions=args.partitions,
                    keys=args.keys,
                    input=work / "in",
                    checkpoint=ckpt,
                )
                build_s[provider] = run(argv, args.timeout)
            times: dict[str, list[float]] = {s: [] for s in STEPS}
            for r in range(args.repeat):
                for step in rotation(STEPS, r):
                    load.phase = step
                    out = work / f"out-{step}-{r}"
                    if step == "spark-repartition":
                        shutil.copytree(sources[ROCKSDB], out)  # Spark's runner writes in place
                        argv = child(
                            "spark-repartition",
                            checkpoint=out,
                            partitions=args.partitions,
                            to_partitions=args.to_partitions,
                        )
                        provider = ROCKSDB
                    elif step == "pss-repartition":
                        argv = [*cli, "repartition", str(sources[OURS]), "--partitions", str(args.to_partitions),
                                "-o", str(out), "--master", "local[2]"]  # fmt: skip
                        provider = OURS
                    else:
                        argv = [*cli, "migrate", str(sources[ROCKSDB]), "--to", "pystatestore", "-o", str(out),
                                "--master", "local[2]"]  # fmt: skip
                        provider = OURS
                    times[step].append(run(argv, args.timeout))
                    to = args.to_partitions if step != "pss-migrate" else args.partitions
                    check_argv = child("check", checkpoint=out, provider=provider, keys=args.keys, to_partitions=to)
                    run(check_argv, args.timeout)
                    shutil.rmtree(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {s: statistics.median(v) for s, v in times.items()}
    base = med["spark-repartition"]
    code_line, load_line = provenance(code, load)
    lines = [
        f"# pystatestore rewrite benchmark, {dt.date.today()}, Spark {pyspark.__version__}, {platform.node()} "
        f"({os.cpu_count()} cores), local[2]",
        f"# command: .venv/bin/python scripts/bench_rewrite.py --keys {args.keys} --partitions {args.partitions} "
        f"--to-partitions {args.to_partitions} --repeat {args.repeat}   ({(time.time() - started) / 60:.0f} min wall)",
        code_line,
        load_line,
        f"# workload: aggregation, {args.keys:,} keys, {args.partitions} partitions; checkpoints built in "
        f"{build_s[ROCKSDB]:.0f} s (RocksDB) and {build_s[OURS]:.0f} s (pystatestore)",
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
    write_report("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
