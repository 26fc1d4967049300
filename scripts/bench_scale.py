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
import re
import shutil
import signal
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

from pystatestore.spark_minors import BUILT_AGAINST

CONF = "spark.sql.streaming.stateStore.pystatestore."
PROVIDERS = {
    "spark-rocksdb": ("org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider", {}),
    "spark-hdfs": ("org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider", {}),
    "pss-rocksdb": ("org.pystatestore.PythonStateStoreProvider", {CONF + "backend": "rocksdb"}),
}
BASELINE = "spark-rocksdb"
PAGE = os.sysconf("SC_PAGE_SIZE")


# -- input ------------------------------------------------------------------------------------
def write_file(input_dir: Path, index: int, keys: pa.Array) -> None:
    path = input_dir / f"f{index:04d}.parquet"
    pq.write_table(pa.table({"k": keys}), path)
    os.utime(path, (1_700_000_000 + index, 1_700_000_000 + index))  # the file source orders by mtime


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


# -- memory -----------------------------------------------------------------------------------
def children_of() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        tree.setdefault(int(fields[1]), []).append(int(proc.name))
    return tree


def subtree(root: int) -> list[int]:
    tree, out, stack = children_of(), [], [root]
    while stack:
        pid = stack.pop()
        out.append(pid)
        stack.extend(tree.get(pid, []))
    return out


def rss_bytes(pid: int) -> int:
    try:
        return int((Path("/proc") / str(pid) / "statm").read_text().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def pss_bytes(pid: int) -> int:
    """Proportional set size: shared pages (libraries, the JDK's files) divided among the processes
    mapping them, which is what a container's memory limit sees of a process tree."""
    try:
        for line in (Path("/proc") / str(pid) / "smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return 0


class HeapWatcher(threading.Thread):
    """How much of the driver JVM's RSS is its Java heap, once a second: the heap's address range
    from `jcmd GC.heap_info`, the resident pages in that range from /proc/<pid>/smaps. Committed
    heap is no measure of this: a heap committed up front (-Xms) is resident only where touched."""

    def __init__(self, jvm: int, stop_event: threading.Event) -> None:
        super().__init__(daemon=True)
        self.jvm, self.stop_event = jvm, stop_event
        self.resident = 0  # bytes of the heap range resident in memory

    def _heap_range(self) -> tuple[int, int] | None:
        try:
            out = subprocess.run(
                ["jcmd", str(self.jvm), "GC.heap_info"], capture_output=True, text=True, timeout=30
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            return None
        m = re.search(r"heap\s+total.*\[(0x[0-9a-f]+), (0x[0-9a-f]+)\)", out)
        return (int(m[1], 16), int(m[2], 16)) if m else None

    def run(self) -> None:
        heap = None
        while heap is None and not self.stop_event.wait(1.0):
            heap = self._heap_range()  # the JVM may not answer while it starts
        while heap is not None and not self.stop_event.is_set():
            self.resident = _resident_in(self.jvm, *heap)
            self.stop_event.wait(1.0)


def _resident_in(pid: int, start: int, end: int) -> int:
    """Resident bytes of `pid`'s mappings inside [start, end)."""
    total, inside = 0, False
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                if "-" in line.split(" ", 1)[0] and not line.startswith(("Rss", "Size")):
                    lo, hi = (int(x, 16) for x in line.split(" ", 1)[0].split("-"))
                    inside = lo >= start and hi <= end
                elif inside and line.startswith("Rss:"):
                    total += int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return 0
    return total


def kind_of(pid: int) -> str:
    """'jvm', 'worker' (pystatestore's state worker) or 'python' (PySpark's workers, others)."""
    if _is_java(pid):
        return "jvm"
    try:
        argv = (Path("/proc") / str(pid) / "cmdline").read_bytes()
    except OSError:
        return "python"
    return "worker" if b"pystatestore.worker" in argv else "python"


class RssSampler(threading.Thread):
    """Peak RSS of the JVMs started by `parent` (a child process) and all their descendants, and
    how that peak split between the JVM, pystatestore's worker and other processes."""

    def __init__(self, parent: int, restart_marker: Path, interval: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.parent, self.restart_marker, self.interval = parent, restart_marker, interval
        self.peak = 0
        self.peak_split: dict[str, int] = {}
        # The peak of each phase: the growing batches, and the restart (which restores all state).
        self.phase_peaks = {"growth": 0, "restart": 0}
        self.phase_splits: dict[str, dict[str, int]] = {"growth": {}, "restart": {}}
        self.peak_pss = 0
        # At the peak RSS: the driver JVM's resident heap (up to a second old) and what the JVM's
        # RSS held besides it (metaspace, code, threads, direct buffers, native libraries).
        self.heap_at_peak = 0
        self.outside_heap_at_peak = 0
        self.heaps: dict[int, HeapWatcher] = {}
        self.stop_event = threading.Event()

    def run(self) -> None:
        self._sample()

    def _sample(self) -> None:
        while not self.stop_event.is_set():
            # The driver JVM is a direct child of the bench's child process (spark-submit execs java).
            jvms = [p for p in children_of().get(self.parent, []) if _is_java(p)]
            split: dict[str, int] = {}
            pss = 0
            for jvm in jvms:
                if jvm not in self.heaps:
                    self.heaps[jvm] = HeapWatcher(jvm, self.stop_event)
                    self.heaps[jvm].start()
                for p in subtree(jvm):
                    kind = kind_of(p)
                    if p != jvm and kind == "jvm":
                        # A child of the JVM that still looks like a JVM is one being spawned (it
                        # shares the JVM's memory until it execs): counting it would double the JVM.
                        continue
                    split[kind] = split.get(kind, 0) + rss_bytes(p)
                    pss += pss_bytes(p)
            total = sum(split.values())
            phase = "restart" if self.restart_marker.exists() else "growth"
            if total > self.phase_peaks[phase]:
                self.phase_peaks[phase], self.phase_splits[phase] = total, split
            if total > self.peak:
                self.peak, self.peak_split = total, split
                heap = sum(self.heaps[j].resident for j in jvms)
                self.heap_at_peak = heap
                self.outside_heap_at_peak = max(split.get("jvm", 0) - heap, 0) if heap else 0
            self.peak_pss = max(self.peak_pss, pss)
            self.stop_event.wait(self.interval)


def _is_java(pid: int) -> bool:
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("java")
    except OSError:
        return False


# -- one provider, in a child process ------------------------------------------------------------
def child(args: argparse.Namespace) -> None:
    """Runs the workload for one provider in this process's own driver JVM; prints a JSON line."""
    from pyspark.sql import SparkSession

    import pystatestore

    provider, extra = PROVIDERS[args.child]
    builder = (
        SparkSession.builder.master("local[2]")
        .appName(f"bench-scale-{args.child}")
        .config("spark.driver.memory", args.driver_memory)
        .config("spark.sql.shuffle.partitions", str(args.partitions))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.streaming.stateStore.providerClass", provider)
    )
    if args.driver_java_options:
        builder = builder.config("spark.driver.extraJavaOptions", args.driver_java_options)
    for k, v in {**extra, **dict(c.split("=", 1) for c in args.conf)}.items():
        builder = builder.config(k, v)
    spark = pystatestore.configure_spark(builder).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", provider)
    input_dir, checkpoint = Path(args.input), Path(args.checkpoint)
    result: dict = {"provider": args.child, "completed": False, "batch_ms": [], "restart_ms": None}

    def run(seen: list[dict]) -> None:
        """Runs the query over all input; appends each batch's progress to `seen` as it completes,
        so a provider that fails part-way still reports how far it got."""
        df = spark.readStream.schema("k long").option("maxFilesPerTrigger", 1).parquet(str(input_dir))
        query = (
            df.groupBy("k")
            .count()
            .writeStream.outputMode("update")
            .format("noop")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
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
def run_sampled(cmd: list[str], restart_marker: Path, timeout: int) -> tuple[str, str, RssSampler, bool, int]:
    """Runs `cmd` (a child that starts its own driver JVM) while sampling the memory of its process
    tree; kills the whole tree after `timeout` s. Returns its stdout, stderr, the sampler, whether it
    timed out, and its exit code."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sampler = RssSampler(proc.pid, restart_marker)
    sampler.start()
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        for pid in reversed(subtree(proc.pid)):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        out, err = proc.communicate()
    sampler.stop_event.set()
    sampler.join()
    return out, err, sampler, timed_out, proc.returncode


def run_provider(name: str, args: argparse.Namespace, work: Path) -> dict:
    input_dir, checkpoint = work / f"in-{name}", work / f"ckpt-{name}"
    restart_marker = work / f"restarting-{name}"
    restart_marker.unlink(missing_ok=True)
    shutil.rmtree(input_dir, ignore_errors=True)
    shutil.rmtree(checkpoint, ignore_errors=True)  # every run starts from nothing
    write_growth_inputs(input_dir, args.keys_per_batch, args.batches)
    cmd = [
        sys.executable,
        __file__,
        "--child",
        name,
        "--input",
        str(input_dir),
        "--checkpoint",
        str(checkpoint),
        "--restart-marker",
        str(restart_marker),
        "--keys-per-batch",
        str(args.keys_per_batch),
        "--batches",
        str(args.batches),
        "--driver-memory",
        args.driver_memory,
        "--partitions",
        str(args.partitions),
        f"--driver-java-options={args.driver_java_options}",
        *[f"--conf={c}" for c in args.conf],
        *(["--check-state"] if args.check_state else []),
    ]
    started = time.time()
    out, err, sampler, timed_out, returncode = run_sampled(cmd, restart_marker, args.timeout)
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    result = json.loads(lines[-1][len("RESULT ") :]) if lines else {"provider": name, "completed": False}
    if not lines:
        result["batch_ms"] = [int(ln.split()[1]) for ln in out.splitlines() if ln.startswith("BATCH ")]
    if timed_out:
        result["error"] = f"did not finish within {args.timeout} s (killed)"
    elif not lines:
        tail = [ln for ln in (err or "").splitlines() if "Exception" in ln or "Error" in ln][-1:]
        result["error"] = f"child exited {returncode}: {tail}"
    # what the JVM printed (to stdout: HotSpot's tty) as it died, with -XX:+ExitOnOutOfMemoryError
    result["out_of_memory"] = "java.lang.OutOfMemoryError" in (out or "") + (err or "")
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
    for key in ("restored_local_bytes", "restored_remote_bytes"):
        values = [r[key] for r in done if r.get(key) is not None]
        merged[key] = statistics.median(values) if values else None
    errors = [r["error"] for r in runs if r.get("error")]
    if errors:
        merged["error"] = errors[0]
    return merged


def fmt_ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def report(results: list[dict], args: argparse.Namespace, command: str) -> str:
    import pyspark

    lines = [
        f"# pystatestore scale bench, {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"# command: {command}",
        f"# machine: {platform.machine()}, {os.cpu_count()} cores, Spark {pyspark.__version__}, local[2], "
        f"{args.partitions} shuffle partitions, spark.driver.memory={args.driver_memory}",
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
                    f"{(r.get('restored_remote_bytes') or 0) / 2**20:,.1f} MiB from the checkpoint"
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
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--input", help=argparse.SUPPRESS)
    ap.add_argument("--checkpoint", help=argparse.SUPPRESS)
    ap.add_argument("--restart-marker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    if args.pyspark:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import build_jar  # scripts/build_jar.py: finds or installs that minor's pyspark

        build_jar.reexec_under_pyspark(args.pyspark)  # the children inherit its PYTHONPATH
    command = "python scripts/bench_scale.py " + " ".join(sys.argv[1:])
    work = Path(tempfile.mkdtemp(prefix="pss-bench-scale-"))
    results: list[dict] = []
    try:
        names = args.providers.split(",")
        runs: dict[str, list[dict]] = {name: [] for name in names}
        for i in range(args.repeat):  # rotating order: no provider always runs first
            for name in names[i % len(names) :] + names[: i % len(names)]:
                print(f"bench_scale: running {name} ({i + 1}/{args.repeat}) ...", file=sys.stderr, flush=True)
                runs[name].append(run_provider(name, args, work))
        results = [median_run(runs[name]) for name in names]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = report(results, args, command)
    print(text, end="")
    if args.out:
        args.out.write_text(text)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
