"""Benchmark: state larger than the heap. Spark's RocksDB provider and pystatestore on one workload,
each in its own JVM, in one run.

Workload (issue 8): `groupBy("k").count()` in update mode whose key space grows by N new keys per
micro-batch (one parquet file per batch through the file source), B batches, `local[2]`, a small
driver heap; then the query is stopped and restarted, and the restarted query runs one small batch
(half known keys, half new) that must first restore the whole state.

Each provider runs in a child process with its own driver JVM. The parent samples the resident
memory (RSS, and PSS) of that JVM and all its descendants (pystatestore's Python worker, PySpark's
workers) every 100 ms, and the driver JVM's resident Java heap once a second. Reported per
provider: whether it completed, keys in state, median batch time, peak RSS and PSS, how the JVM's
RSS at the peak splits into Java heap and the rest, and the restart batch time; then ratios to
Spark's RocksDB provider. `--driver-java-options=-Xms1g` stops heap growth from deciding the ratio.

    .venv/bin/python scripts/bench_scale.py [--keys-per-batch 1000000] [--batches 8]
        [--driver-memory 1g] [--partitions 4] [--providers spark-rocksdb,pss-rocksdb] [--out FILE]
        [--pyspark 4.1|4.2|4.3]

--pyspark runs the whole benchmark on that Spark minor (its pyspark, installed once per machine by
scripts/build_jar.py, first on PYTHONPATH), against that minor's own built-in provider.
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
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from benchlib.build import reexec_under_pyspark
from benchlib.child import hidden_options, result_line, run_child, script_argv
from benchlib.inputs import stamp_order
from benchlib.providers import PROVIDER_CONF, sql_conf
from benchlib.repeats import rotation
from benchlib.report import code_version, provenance, watching_load, write_report
from benchlib.samplers import LoadMonitor, MemorySampler
from pystatestore.spark_minors import BUILT_AGAINST

# this benchmark's names of the providers it runs (benchlib.providers' table)
PROVIDERS = {"spark-rocksdb": "rocksdb", "spark-hdfs": "hdfs", "pss-rocksdb": "pss-changelog"}
BASELINE = "spark-rocksdb"
PHASES = ("growth", "restart")  # the growing batches, and the restart (which restores all state)


# -- input ------------------------------------------------------------------------------------
def write_file(input_dir: Path, index: int, keys: pa.Array) -> None:
    path = input_dir / f"f{index:04d}.parquet"
    pq.write_table(pa.table({"k": keys}), path)
    stamp_order(path, index)


def write_growth_inputs(input_dir: Path, per_batch: int, batches: int) -> None:
    input_dir.mkdir(parents=True)
    for b in range(batches):
        write_file(input_dir, b, pa.array(range(b * per_batch, (b + 1) * per_batch), pa.int64()))


RESTART_ROWS = 10_000


def restart_keys(per_batch: int, batches: int, rows: int = RESTART_ROWS) -> tuple[range, range]:
    """(keys the restart batch counts again, keys it adds): half and half."""
    known = range(0, per_batch * batches, max(1, per_batch * batches // (rows // 2)))[: rows // 2]
    return known, range(per_batch * batches, per_batch * batches + rows // 2)


def write_restart_input(input_dir: Path, per_batch: int, batches: int) -> None:
    known, new = restart_keys(per_batch, batches)
    write_file(input_dir, batches, pa.array([*known, *new], pa.int64()))


def check_state(spark: Any, checkpoint: Path, per_batch: int, batches: int) -> dict[str, int]:
    """Reads every row of the final state back through Spark's state data source and checks each
    count against the input (not against the query's own metrics): every key of the growth
    batches counted once, the restart batch's known keys twice, its new keys once."""
    from pyspark.sql import functions as F

    known, new = restart_keys(per_batch, batches)
    k, count = F.col("key.k"), F.col("value.count")
    twice = (k < known.stop) & (k % known.step == 0) & (k < known.step * len(known))
    expected = F.when(twice, F.lit(2)).otherwise(F.lit(1))
    row = (
        spark.read.format("statestore")
        .load(str(checkpoint))
        .agg(
            F.count("*").alias("rows"),
            F.sum((count != expected).cast("long")).alias("wrong"),
            F.sum(F.when((k < 0) | (k >= new.stop), 1).otherwise(0)).alias("unknown_keys"),
            F.countDistinct(k).alias("distinct_keys"),
        )
        .collect()[0]
    )
    return {name: int(row[name] or 0) for name in ("rows", "wrong", "unknown_keys", "distinct_keys")}


# -- one provider, in a child process ------------------------------------------------------------
def child(args: argparse.Namespace) -> None:
    """Runs the workload for one provider in this process's own driver JVM; prints a JSON line."""
    from benchlib.session import start_noop, start_session

    user = dict(c.split("=", 1) for c in args.conf)  # wins over the provider's confs, not its class
    session = {"spark.driver.memory": args.driver_memory}
    if args.driver_java_options:
        session["spark.driver.extraJavaOptions"] = args.driver_java_options
    spark = start_session(
        f"bench-scale-{args.child}",
        partitions=args.partitions,
        sql_conf={k: v for k, v in sql_conf(PROVIDERS[args.child]).items() if k == PROVIDER_CONF or k not in user},
        **{**session, **user},
    )
    input_dir, checkpoint = Path(args.input), Path(args.checkpoint)
    result: dict = {"provider": args.child, "completed": False, "batch_ms": [], "restart_ms": None}

    def run(seen: list[dict]) -> None:
        """Runs the query over all input; appends each batch's progress to `seen` as it completes,
        so a provider that fails part-way still reports how far it got."""
        df = spark.readStream.schema("k long").option("maxFilesPerTrigger", 1).parquet(str(input_dir))
        query = start_noop(df.groupBy("k").count(), checkpoint)
        ids: set[int] = set()

        def collect() -> None:
            for p in query.recentProgress:
                if p["numInputRows"] > 0 and p["batchId"] not in ids:
                    ids.add(p["batchId"])
                    seen.append(p)
                    print(f"BATCH {p['durationMs']['triggerExecution']}", flush=True)  # survives a kill

        while query.isActive:
            collect()
            time.sleep(0.5)
        collect()
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()).splitlines()[0][:500])

    progress: list[dict] = []
    try:
        run(progress)
    except Exception as e:  # noqa: BLE001 - a provider that fails is a result, reported as such
        result["error"] = str(e)[:500]
    result["batch_ms"] = [p["durationMs"]["triggerExecution"] for p in progress]
    # Where each batch's state time went (Spark's own split, and ours from our custom metrics).
    result["state_ops"] = [
        {k: v for k, v in p["stateOperators"][0].items() if k.endswith("TimeMs") or k == "customMetrics"}
        for p in progress
    ]
    result["keys"] = progress[-1]["stateOperators"][0]["numRowsTotal"] if progress else 0
    if "error" not in result:
        try:
            restarted: list[dict] = []
            Path(args.restart_marker).touch()  # the parent's sampler counts what follows as the restart
            write_restart_input(input_dir, args.keys_per_batch, args.batches)
            run(restarted)
            result["restart_ms"] = restarted[0]["durationMs"]["triggerExecution"]
            # Where the restart's state came from (ours reports it; Spark's providers load from the
            # checkpoint: the restarted query's new provider instances start with empty local dirs).
            restored = restarted[0]["stateOperators"][0].get("customMetrics", {})
            result["restored_local_bytes"] = restored.get("pystatestoreRestoreLocalBytes")
            result["restored_remote_bytes"] = restored.get("pystatestoreRestoreRemoteBytes")
            result["restored_inline_bytes"] = restored.get("pystatestoreRestoreInlineBytes")
            result["keys_after_restart"] = restarted[0]["stateOperators"][0]["numRowsTotal"]
            # Where the restart batch's time went: Spark's split of the batch, the state operator's
            # own times, and ours (restore, load) from the custom metrics.
            result["restart_split"] = {
                **{f"batch {k}": v for k, v in restarted[0]["durationMs"].items()},
                **{k: v for k, v in restarted[0]["stateOperators"][0].items() if k.endswith("TimeMs")},
                **{k: v for k, v in restored.items() if k.endswith("Ms")},
            }
            if args.check_state:
                result["state_check"] = check_state(spark, checkpoint, args.keys_per_batch, args.batches)
            result["completed"] = True
        except Exception as e:  # noqa: BLE001
            result["error"] = f"after the restart: {str(e)[:500]}"
    print("RESULT " + json.dumps(result), flush=True)
    try:
        spark.stop()
    except Exception:  # noqa: BLE001 - a JVM that ran out of memory may not stop cleanly
        pass


# -- the run ------------------------------------------------------------------------------------
def run_provider(name: str, args: argparse.Namespace, work: Path) -> dict:
    input_dir, checkpoint = work / f"in-{name}", work / f"ckpt-{name}"
    restart_marker = work / f"restarting-{name}"
    restart_marker.unlink(missing_ok=True)
    shutil.rmtree(input_dir, ignore_errors=True)
    shutil.rmtree(checkpoint, ignore_errors=True)  # every run starts from nothing
    write_growth_inputs(input_dir, args.keys_per_batch, args.batches)
    cmd = script_argv(
        __file__,
        child=name,
        input=input_dir,
        checkpoint=checkpoint,
        restart_marker=restart_marker,
        keys_per_batch=args.keys_per_batch,
        batches=args.batches,
        driver_memory=args.driver_memory,
        partitions=args.partitions,
        driver_java_options=args.driver_java_options,
        conf=args.conf,
        check_state=args.check_state,
    )
    started = time.time()

    def watch(pid: int) -> list[MemorySampler]:
        return [MemorySampler(pid, lambda: "restart" if restart_marker.exists() else "growth", PHASES)]

    run = run_child(cmd, timeout=args.timeout, watch=watch)
    out, err, sampler = run.stdout, run.stderr, run.watchers[0]
    line = result_line(out)
    result = json.loads(line) if line else {"provider": name, "completed": False}
    if not line:
        result["batch_ms"] = [int(ln.split()[1]) for ln in out.splitlines() if ln.startswith("BATCH ")]
    if run.timed_out:
        result["error"] = f"did not finish within {args.timeout} s (killed)"
    elif not line:
        tail = [ln for ln in err.splitlines() if "Exception" in ln or "Error" in ln][-1:]
        result["error"] = f"child exited {run.returncode}: {tail}"
    # what the JVM printed (to stdout: HotSpot's tty) as it died, with -XX:+ExitOnOutOfMemoryError
    result["out_of_memory"] = "java.lang.OutOfMemoryError" in out + err
    result["peak_rss"] = sampler.peak
    result["peak_pss"] = sampler.peak_pss
    result["heap_at_peak"] = sampler.heap_at_peak
    result["outside_heap_at_peak"] = sampler.outside_heap_at_peak
    result["peak_split"] = sampler.peak_split
    result["phase_peaks"] = sampler.phase_peaks
    result["phase_splits"] = sampler.phase_splits
    result["wall_s"] = time.time() - started
    shutil.rmtree(input_dir, ignore_errors=True)
    shutil.rmtree(checkpoint, ignore_errors=True)
    return result


def median_run(runs: list[dict]) -> dict:
    """One provider's runs as one result: each measure is the median over the runs that completed
    (peak RSS over all runs); the provider completed only if every run did."""
    if len(runs) == 1:
        return runs[0]
    done = [r for r in runs if r["completed"]] or runs
    merged = dict(done[0])
    merged["completed"] = all(r["completed"] for r in runs)
    merged["runs"] = len(runs)
    merged["peak_rss"] = int(statistics.median(r["peak_rss"] for r in runs))
    nearest = min(runs, key=lambda r: abs(r["peak_rss"] - merged["peak_rss"]))  # the run the splits come from
    merged["peak_split"] = nearest.get("peak_split", {})
    merged["peak_pss"] = int(statistics.median(r.get("peak_pss", 0) for r in runs))
    for key in ("heap_at_peak", "outside_heap_at_peak"):  # from the run whose peak RSS is the median
        merged[key] = nearest.get(key, 0)
    merged["peak_rss_runs"] = [r["peak_rss"] for r in runs]
    merged["phase_peaks"] = {
        phase: int(statistics.median(r.get("phase_peaks", {}).get(phase, 0) for r in runs))
        for phase in ("growth", "restart")
    }
    merged["phase_splits"] = nearest.get("phase_splits", {})
    medians = [statistics.median(r["batch_ms"]) for r in done if r.get("batch_ms")]
    if medians:
        merged["batch_ms"] = [statistics.median(medians)]  # the median of the runs' median batch
        merged["max_batch_ms"] = max(max(r["batch_ms"]) for r in done if r.get("batch_ms"))
    restarts = [r["restart_ms"] for r in done if r.get("restart_ms")]
    merged["restart_ms"] = statistics.median(restarts) if restarts else None
    for key in ("restored_local_bytes", "restored_remote_bytes", "restored_inline_bytes"):
        values = [r[key] for r in done if r.get(key) is not None]
        merged[key] = statistics.median(values) if values else None
    errors = [r["error"] for r in runs if r.get("error")]
    if errors:
        merged["error"] = errors[0]
    return merged


def fmt_ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def report(results: list[dict], args: argparse.Namespace, command: str, code: str, load: LoadMonitor) -> str:
    import pyspark

    code_line, load_line = provenance(code, load)
    lines = [
        f"# pystatestore scale bench, {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"# command: {command}",
        code_line,
        f"# machine: {platform.machine()}, {os.cpu_count()} cores, Spark {pyspark.__version__}, local[2], "
        f"{args.partitions} shuffle partitions, spark.driver.memory={args.driver_memory}",
        load_line,
        f"# workload: groupBy(k).count(), {args.keys_per_batch:,} new keys per batch, {args.batches} batches, "
        "then a restart and one batch of 10,000 rows (half known keys)",
        "# memory: peak RSS of the driver JVM and all its descendants (Python workers included), sampled every 100 ms;",
        "# peak PSS of the same processes (shared pages divided among them: what a container limit sees); the",
        "# driver JVM's RSS at that peak split into its Java heap's resident pages (once a second) and the rest",
        f"# each provider ran {args.repeat} time(s) in its own JVM, in rotating order; figures: medians over the runs",
        "# the restart is a new query in the same JVM (the driver keeps running, as after a query failure)",
        "",
        f"{'provider':<15}{'completed':>10}{'keys':>12}{'median batch ms':>17}{'max batch ms':>14}"
        f"{'peak RSS MiB':>14}{'restart batch ms':>18}",
    ]
    for r in results:
        batches = r.get("batch_ms") or []
        median, slowest = (statistics.median(batches), r.get("max_batch_ms", max(batches))) if batches else (None, None)
        lines.append(
            f"{r['provider']:<15}{'yes' if r['completed'] else 'NO':>10}{r.get('keys', 0):>12,}"
            f"{fmt_ms(median):>17}{fmt_ms(slowest):>14}"
            f"{r['peak_rss'] / 2**20:>14,.0f}{fmt_ms(r.get('restart_ms')):>18}"
        )
        if r.get("peak_pss"):
            lines.append(f"  {r['provider']} peak PSS (MiB): {r['peak_pss'] / 2**20:,.0f}")
        if r.get("heap_at_peak"):
            lines.append(
                f"  {r['provider']} driver JVM at peak RSS (MiB): Java heap {r['heap_at_peak'] / 2**20:,.0f}, "
                f"outside the heap {r['outside_heap_at_peak'] / 2**20:,.0f}"
            )
        if len(r.get("peak_rss_runs") or []) > 1:
            runs = ", ".join(f"{v / 2**20:,.0f}" for v in r["peak_rss_runs"])
            lines.append(f"  {r['provider']} peak RSS of each run (MiB): {runs}")
        split = r.get("peak_split") or {}
        if split:
            parts = ", ".join(f"{kind} {size / 2**20:,.0f}" for kind, size in sorted(split.items()))
            lines.append(f"  {r['provider']} at peak RSS (MiB): {parts}")
        phases, phase_splits = r.get("phase_peaks") or {}, r.get("phase_splits") or {}
        for phase, described in (("growth", "growing batches"), ("restart", "restart")):
            if phases.get(phase):
                parts = ", ".join(f"{k} {v / 2**20:,.0f}" for k, v in sorted(phase_splits.get(phase, {}).items()))
                lines.append(
                    f"  {r['provider']} peak RSS in the {described} (MiB): {phases[phase] / 2**20:,.0f}"
                    + (f" ({parts})" if parts else "")
                )
        if r.get("restart_ms"):
            if r.get("restored_local_bytes") is not None:
                where = (
                    f"{r['restored_local_bytes'] / 2**20:,.1f} MiB from its local recovery copies, "
                    f"{(r.get('restored_remote_bytes') or 0) / 2**20:,.1f} MiB of files and "
                    f"{(r.get('restored_inline_bytes') or 0) / 2**20:,.1f} MiB of changes inside manifests "
                    "from the checkpoint"
                )
            else:
                where = "the checkpoint (new provider instances of the restarted query, nothing local)"
            lines.append(f"  {r['provider']} restart restored its state from: {where}")
            split = r.get("restart_split") or {}
            if split:
                parts = ", ".join(f"{k} {v:,}" for k, v in split.items() if v)
                lines.append(f"  {r['provider']} restart batch (ms; state times summed over partitions): {parts}")
        if r.get("error"):
            lines.append(f"  {r['provider']} failed after {len(batches)} batches: {r['error'][:300]}")
    base = next((r for r in results if r["provider"] == BASELINE), None)
    if base is not None:
        lines.append("")
        for r in results:
            if r is base:
                continue
            mine, theirs = r.get("batch_ms") or [], base.get("batch_ms") or []
            ratios = [f"completes where {BASELINE} does: {'yes' if r['completed'] or not base['completed'] else 'NO'}"]
            if base["peak_rss"]:
                ratios.append(f"peak RSS {r['peak_rss'] / base['peak_rss']:.2f}x")
            if base.get("peak_pss") and r.get("peak_pss"):
                ratios.append(f"peak PSS {r['peak_pss'] / base['peak_pss']:.2f}x")
            if mine and theirs and r["completed"]:
                ratios.append(f"median batch {statistics.median(mine) / statistics.median(theirs):.2f}x")
            if r.get("restart_ms") and base.get("restart_ms"):
                ratios.append(f"restart batch {r['restart_ms'] / base['restart_ms']:.2f}x")
            lines.append(f"{r['provider']} / {BASELINE}: " + ", ".join(ratios))
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys-per-batch", type=int, default=1_000_000)
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--driver-memory", default="1g")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--providers", default="spark-rocksdb,pss-rocksdb")
    ap.add_argument("--timeout", type=int, default=3600)
    ap.add_argument("--repeat", type=int, default=1, help="runs per provider; medians are reported")
    ap.add_argument("--driver-java-options", default="", help="extra JVM options of the driver (diagnostics)")
    ap.add_argument("--conf", action="append", default=[], help="extra Spark conf KEY=VALUE for every provider")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--pyspark", choices=list(BUILT_AGAINST), help="the Spark minor to run (default: the venv's)")
    ap.add_argument("--json", type=Path, default=None, help="also write the raw results as JSON (for tests)")
    ap.add_argument(
        "--check-state",
        action="store_true",
        help="after the restart, read every state row back through Spark's state data source and check it "
        "against the input",
    )
    hidden_options(ap, "--child", "--input", "--checkpoint", "--restart-marker")
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    reexec_under_pyspark(args.pyspark)  # the children inherit its PYTHONPATH
    command = "python scripts/bench_scale.py " + " ".join(sys.argv[1:])
    code = code_version()
    work = Path(tempfile.mkdtemp(prefix="pss-bench-scale-"))
    results: list[dict] = []
    try:
        names = args.providers.split(",")
        runs: dict[str, list[dict]] = {name: [] for name in names}
        with watching_load() as load:
            for i in range(args.repeat):  # rotating order: no provider always runs first
                for name in rotation(names, i):
                    print(f"bench_scale: running {name} ({i + 1}/{args.repeat}) ...", file=sys.stderr, flush=True)
                    load.phase = name
                    runs[name].append(run_provider(name, args, work))
        results = [median_run(runs[name]) for name in names]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write_report(report(results, args, command, code, load), args.out)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
