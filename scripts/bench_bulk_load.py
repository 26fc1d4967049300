"""Benchmark: bulk load, the first micro-batch of a new query over a backlog (issue 34, item 3).

Workload: `groupBy("k").count()` in update mode over one parquet file of N distinct new keys, read
by a new query's first micro-batch (`local[2]`, 4 shuffle partitions, `spark.driver.memory=1g`).
Each run is a fresh driver JVM that runs one such batch and exits: a first batch is mostly JVM
warm-up, and a provider that ran after another in the same JVM would inherit its warm JIT.
Providers: Spark's HDFS and RocksDB (changelog checkpointing, as Spark recommends) providers and
pystatestore (its default: changelog commits), in rotating order, `--repeat` runs each; figures are
medians with their ranges.

A control sets the floor: `no-state`, the same first batch with no state store at all (a
`foreachBatch` that runs the same aggregation as a batch query, in a fresh JVM as well). What a
provider's first batch takes above it is the state store's; a provider cannot get below it.

Where each first batch went: Spark's split of the batch (`durationMs`), the state operator's times
summed over partitions (`allUpdatesTimeMs`, `commitTimeMs`), and for pystatestore its custom
metrics summed over partitions: waiting for the worker to start, writing the Arrow frame, the
worker's SST write, ingest, RocksDB checkpoint and upload, and the call as the JVM sees it. Memory:
peak RSS of the JVM and all its descendants (benchlib.samplers.MemorySampler, as bench_scale.py).

    .venv/bin/python scripts/bench_bulk_load.py [--keys 1000000,8000000] [--repeat 3]
        [--partitions 4] [--driver-memory 1g] [--providers no-state,spark-hdfs,spark-rocksdb,pss-rocksdb]
        [--pyspark 4.1|4.2|4.3] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from benchlib.build import reexec_under_pyspark
from benchlib.child import hidden_options, result_line, run_child, script_argv
from benchlib.providers import PROVIDER_CONF, sql_conf
from benchlib.repeats import rotation
from benchlib.report import code_version, provenance, watching_load, write_report
from benchlib.samplers import LoadMonitor, MemorySampler
from pystatestore.spark_minors import BUILT_AGAINST

# this benchmark's names of the providers it runs (benchlib.providers' table); None: no state store
PROVIDERS: dict[str, str | None] = {
    "no-state": None,
    "spark-hdfs": "hdfs",
    "spark-rocksdb": "rocksdb-changelog",
    "pss-rocksdb": "pss-changelog",
}
# pystatestore's custom metrics of a commit, in the order its time goes (summed over partitions).
OUR_SPLIT = [
    ("pystatestoreWorkerStartMs", "waiting for a worker to start"),
    ("pystatestoreBridgeMs", "Arrow frame written in the JVM (sort + copy)"),
    ("pystatestoreWorkerCallMs", "the worker call as the JVM sees it"),
    ("pystatestoreWorkerCommitMs", "  of which the worker's commit"),
    ("pystatestoreApplyMs", "    SST written"),
    ("pystatestoreFlushMs", "    SST ingested"),
    ("pystatestoreCheckpointMs", "    RocksDB checkpoint (the JVM's view)"),
    ("pystatestoreUploadMs", "    uploaded (changelog segment)"),
    ("pystatestoreManifestMs", "    manifest written"),
    ("pystatestoreCommitMs", "the commit as the task sees it"),
]


def child(args: argparse.Namespace) -> None:
    """One first batch in this process's own driver JVM; prints a JSON line."""
    from benchlib.session import start_session

    jvm_started = time.monotonic()
    provider = PROVIDERS[args.child]
    # Every run gets the same jar and confs; only the provider differs (none for the control).
    spark = start_session(
        f"bench-bulk-load-{args.child}",
        partitions=args.partitions,
        sql_conf=sql_conf(provider) if provider else {},
        **{"spark.driver.memory": args.driver_memory},
    )
    if provider is None:
        spark.conf.unset(PROVIDER_CONF)
    result: dict = {"provider": args.child, "session_s": time.monotonic() - jvm_started}
    df = spark.readStream.schema("k long").parquet(args.input)
    if provider is None:

        def aggregate(batch, _batch_id: int) -> None:  # noqa: ANN001 - a DataFrame
            batch.groupBy("k").count().write.format("noop").mode("overwrite").save()

        writer = df.writeStream.foreachBatch(aggregate)
    else:
        writer = df.groupBy("k").count().writeStream.outputMode("update").format("noop")
    query = writer.option("checkpointLocation", args.checkpoint).trigger(availableNow=True).start()
    query.awaitTermination()
    progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    if query.exception() is not None or not progress:
        result["error"] = str(query.exception() or "no batch read the input").splitlines()[0][:500]
    else:
        first = progress[0]
        result["batch_ms"] = first["durationMs"]["triggerExecution"]
        result["duration_split"] = first["durationMs"]
        ops = first.get("stateOperators") or []
        if ops:
            op = ops[0]
            result["keys"] = op["numRowsTotal"]
            result["state_split"] = {k: v for k, v in op.items() if k.endswith("TimeMs")}
            result["custom"] = {k: v for k, v in op.get("customMetrics", {}).items() if k.endswith("Ms")}
        else:
            result["keys"] = first["numInputRows"]
    print("RESULT " + json.dumps(result), flush=True)
    spark.stop()


def write_input(input_dir: Path, keys: int) -> None:
    input_dir.mkdir(parents=True)
    pq.write_table(pa.table({"k": pa.array(range(keys), pa.int64())}), input_dir / "backlog.parquet")


def run_once(name: str, keys: int, args: argparse.Namespace, work: Path) -> dict:
    input_dir = work / f"in-{keys}"
    if not input_dir.exists():
        write_input(input_dir, keys)
    checkpoint = work / f"ckpt-{name}"
    shutil.rmtree(checkpoint, ignore_errors=True)
    cmd = script_argv(
        __file__,
        child=name,
        input=input_dir,
        checkpoint=checkpoint,
        partitions=args.partitions,
        driver_memory=args.driver_memory,
    )
    run = run_child(cmd, timeout=args.timeout, watch=lambda pid: [MemorySampler(pid)])
    peak = run.watchers[0].peak
    shutil.rmtree(checkpoint, ignore_errors=True)
    line = result_line(run.stdout)
    if line is None:
        if "java.lang.OutOfMemoryError" in run.stdout + run.stderr:
            why = "the driver JVM ran out of memory (java.lang.OutOfMemoryError)"
        elif run.timed_out:
            why = f"no result within {args.timeout} s (killed)"
        else:
            why = f"child exited {run.returncode}: {[ln for ln in run.stderr.splitlines() if 'Error' in ln][-2:]}"
        return {"provider": name, "error": why, "peak_rss": peak}
    result = json.loads(line)
    result["peak_rss"] = peak
    return result


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize(runs: list[dict]) -> dict:
    """One provider's runs at one key count: medians (and ranges) over the runs that completed."""
    done = [r for r in runs if "error" not in r]
    out: dict = {"runs": len(runs), "completed": len(done), "errors": [r["error"] for r in runs if "error" in r]}
    if not done:
        return out
    out["batch_ms"] = [r["batch_ms"] for r in done]
    out["peak_rss"] = med([r["peak_rss"] for r in done])
    out["keys"] = done[0].get("keys", 0)
    for field in ("duration_split", "state_split", "custom"):
        keys = sorted({k for r in done for k in r.get(field, {})})
        out[field] = {k: med([r.get(field, {}).get(k, 0) for r in done]) for k in keys}
    return out


def report(
    results: dict[int, dict[str, dict]], args: argparse.Namespace, command: str, code: str, load: LoadMonitor
) -> str:
    import pyspark

    code_line, load_line = provenance(code, load)
    lines = [
        f"# pystatestore bulk-load bench, {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"# command: {command}",
        code_line,
        f"# machine: {platform.machine()}, {os.cpu_count()} cores, Spark {pyspark.__version__}, local[2], "
        f"{args.partitions} shuffle partitions, spark.driver.memory={args.driver_memory}",
        load_line,
        "# workload: a new query's first micro-batch, groupBy(k).count() (update mode, noop sink) over one parquet",
        "# file of N distinct keys; each run a fresh driver JVM, providers in rotating order; medians [min-max]",
        "# spark-rocksdb runs changelog checkpointing; pss-rocksdb its default (changelog commits);",
        "# no-state: the same batch's aggregation with no state store (foreachBatch): the floor",
        f"# a provider that fails at a size (out of memory, no result within {args.timeout} s) is not run again there",
        "",
    ]
    for keys, by_provider in results.items():
        lines.append(f"## {keys:,} keys")
        lines.append(f"{'provider':<15}{'runs ok':>8}{'first batch ms':>16}{'range':>18}{'peak RSS MiB':>14}")
        for name, s in by_provider.items():
            if not s.get("batch_ms"):
                lines.append(f"{name:<15}{s['completed']:>5}/{s['runs']:<2}  failed: {'; '.join(s['errors'])[:300]}")
                continue
            b = s["batch_ms"]
            lines.append(
                f"{name:<15}{s['completed']:>5}/{s['runs']:<2}{med(b):>16,.0f}"
                f"{f'{min(b):,}-{max(b):,}':>18}{s['peak_rss'] / 2**20:>14,.0f}"
            )
        lines.append("")
        for name, s in by_provider.items():
            if not s.get("batch_ms"):
                continue
            split = ", ".join(f"{k} {v:,.0f}" for k, v in s["duration_split"].items() if v)
            lines.append(f"  {name} batch (ms): {split}")
            if s.get("state_split"):
                parts = ", ".join(f"{k} {v:,.0f}" for k, v in s["state_split"].items() if v)
                lines.append(f"  {name} state operator (ms, summed over partitions): {parts}")
            if name == "pss-rocksdb" and s.get("custom"):
                parts = ", ".join(
                    f"{label.strip()} {s['custom'][metric]:,.0f}"
                    for metric, label in OUR_SPLIT
                    if metric in s["custom"]
                )
                lines.append(f"  {name} commit (ms, summed over partitions): {parts}")
        floor = by_provider.get("no-state", {}).get("batch_ms")
        ours = by_provider.get("pss-rocksdb", {}).get("batch_ms")
        spark = [by_provider[p] for p in ("spark-hdfs", "spark-rocksdb") if by_provider.get(p, {}).get("batch_ms")]
        lines.append("")
        if ours and spark:
            fastest = min(spark, key=lambda s: med(s["batch_ms"]))
            fastest_name = next(n for n, s in by_provider.items() if s is fastest)
            lines.append(
                f"pss-rocksdb / the faster Spark provider ({fastest_name}): first batch "
                f"{med(ours) / med(fastest['batch_ms']):.2f}x"
            )
            for name in ("spark-hdfs", "spark-rocksdb"):
                if by_provider.get(name, {}).get("batch_ms"):
                    lines.append(
                        f"pss-rocksdb / {name}: first batch {med(ours) / med(by_provider[name]['batch_ms']):.2f}x"
                    )
        if floor:
            for name, s in by_provider.items():
                if name != "no-state" and s.get("batch_ms"):
                    lines.append(
                        f"{name}: {med(s['batch_ms']) - med(floor):,.0f} ms above the no-state floor "
                        f"({med(floor):,.0f} ms)"
                    )
            if spark:
                fastest_ms = min(med(s["batch_ms"]) for s in spark)
                lines.append(
                    f"the no-state floor is {med(floor) / fastest_ms:.2f}x the faster Spark provider: "
                    f"no provider's first batch can be below that ratio"
                )
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", default="1000000,8000000", help="comma-separated key counts, one first batch each")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--driver-memory", default="1g")
    ap.add_argument("--providers", default=",".join(PROVIDERS))
    ap.add_argument("--timeout", type=int, default=300, help="seconds one run may take; then it is killed")
    ap.add_argument("--pyspark", choices=list(BUILT_AGAINST), help="the Spark minor to run (default: the venv's)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--child", choices=list(PROVIDERS), help=argparse.SUPPRESS)
    hidden_options(ap, "--input", "--checkpoint")
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    reexec_under_pyspark(args.pyspark)
    command = "python scripts/bench_bulk_load.py " + " ".join(sys.argv[1:])
    code = code_version()
    names = args.providers.split(",")
    unknown = set(names) - set(PROVIDERS)
    if unknown:
        ap.error(f"unknown providers {sorted(unknown)}; known: {', '.join(PROVIDERS)}")
    work = Path(tempfile.mkdtemp(prefix="pss-bench-bulk-"))
    results: dict[int, dict[str, dict]] = {}
    try:
        with watching_load() as load:
            for keys in (int(k) for k in args.keys.split(",")):
                runs: dict[str, list[dict]] = {n: [] for n in names}
                for i in range(args.repeat):
                    for name in rotation(names, i):
                        if any("error" in r for r in runs[name]):
                            continue  # a provider that failed at this size (out of memory, timed out) is not run again
                        print(f"bench_bulk_load: {keys:,} keys, {name} ({i + 1}/{args.repeat})", file=sys.stderr)
                        load.phase = f"{name}@{keys}"
                        r = run_once(name, keys, args, work)
                        print(f"  first batch {r.get('batch_ms', r.get('error'))}", file=sys.stderr, flush=True)
                        runs[name].append(r)
                results[keys] = {n: summarize(runs[n]) for n in names}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write_report(report(results, args, command, code, load), args.out)


if __name__ == "__main__":
    main()
