"""Soak benchmark: one streaming aggregation running for a long time on Spark's defaults, on
pystatestore (changelog commits) and on Spark's RocksDB provider with changelog checkpointing, each
in its own JVM, one after the other on the same workload.

What a 20-batch benchmark cannot show: Spark's maintenance at its default interval (60 s), its
state store coordinator (which forces snapshots of stores it judges lagging), its retention
(minBatchesToRetain 100) and minDeltasForSnapshot (10), over hundreds of batches. Per window of 100
batches it reports commit p50 (Spark's commitTimeMs per partition), batch time, and, sampled every
few seconds from /proc, the resident memory (RSS), open file descriptors and threads of the JVM and
every process under it (our state workers included), and the checkpoint's files and bytes. Snapshots
are counted from the files that appear in the checkpoint (pystatestore: snapshots/*.json, or a
snapshot manifest; Spark RocksDB: <version>.zip), whatever later deletes them.

    .venv/bin/python scripts/bench_soak.py [--minutes 30] [--partitions 200] [--keys 100000]
        [--touched-pct 1] [--pyspark 4.1|4.2|4.3] [--out bench/soak-....txt] [--raw bench/soak-....json]

Goals (issue 29), checked at the end: ours' last window commit p50 within 1.1x of its first steady
window and at most 0.5x Spark RocksDB changelog's; snapshots per store within one of versions /
minDeltasForSnapshot; RSS, descriptors, threads and checkpoint size flat after the first window
(no growth beyond 5%).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OURS = "org.pystatestore.PythonStateStoreProvider"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
# name -> (provider class, session confs); everything else is Spark's default
RUNS: dict[str, tuple[str, dict[str, str]]] = {
    "pss-changelog": (OURS, {}),
    "rocksdb-changelog": (ROCKSDB, {"spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true"}),
}
WINDOW = int(os.environ.get("PSS_SOAK_WINDOW", "100"))  # batches
MIN_PARTIAL = 10  # batches a trailing partial window needs to be reported
MIN_DELTAS = 10  # Spark's default minDeltasForSnapshot
SAMPLE_S = 5.0
# A measurement setting, not a tuning: a JVM's RSS grows as its heap is first touched, over minutes
# (both providers' JVMs grew by ~300 MiB around minute 10 of a 30-minute run); touching the whole
# heap (Spark's default spark.driver.memory) at start leaves growth that is the run's own.
TOUCH_HEAP = "-Xms1g -XX:+AlwaysPreTouch"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# Other work on the machine, in cores, above which a window's timings are marked as disturbed.
OTHER_CPU_LIMIT = 0.1
# A snapshot file of each provider: ours in changelog mode, Spark RocksDB's.
SNAPSHOT_FILE = {
    "pss-changelog": re.compile(r"snapshots/(\d+)-[0-9a-f]+\.json$"),
    "rocksdb-changelog": re.compile(r"(?:^|/)(\d+)(?:_[0-9a-f-]+)?\.zip$"),
}


def build_jar_module():  # noqa: ANN201 - scripts/build_jar.py, loaded by path
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_jar", ROOT / "scripts" / "build_jar.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- the child: one provider, one JVM ---------------------------------------------------------------
def run_child(args: argparse.Namespace) -> None:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.streaming import StreamingQueryListener

    import pystatestore

    provider, confs = RUNS[args.child]
    builder = (
        SparkSession.builder.master("local[2]")
        .appName(f"pystatestore-soak-{args.child}")
        .config("spark.sql.shuffle.partitions", str(args.partitions))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
    )
    for k, v in confs.items():
        builder = builder.config(k, v)
    if args.driver_java_options:
        builder = builder.config("spark.driver.extraJavaOptions", args.driver_java_options)
    # configure_spark adds our jar and names our provider: the run's own provider is set after it
    builder = pystatestore.configure_spark(builder).config("spark.sql.streaming.stateStore.providerClass", provider)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    progress_file = open(args.progress, "a")  # noqa: SIM115 - written by the listener until the end

    class Recorder(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:  # noqa: N802 - Spark's names
            pass

        def onQueryProgress(self, event: Any) -> None:  # noqa: N802
            progress_file.write(event.progress.json.replace("\n", " ") + "\n")
            progress_file.flush()

        def onQueryIdle(self, event: Any) -> None:  # noqa: N802
            pass

        def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
            pass

    spark.streams.addListener(Recorder())
    source = spark.readStream.schema("key long, value long").option("maxFilesPerTrigger", 1).parquet(args.input)
    query = (
        source.groupBy("key")
        .agg(F.count("*").alias("n"), F.sum("value").alias("total"))
        .writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", args.checkpoint)
        .start()
    )
    deadline = time.time() + args.minutes * 60
    while time.time() < deadline and query.isActive:
        time.sleep(1)
    if query.exception() is not None:
        raise SystemExit(f"{args.child}: the query failed: {query.exception()}")
    query.stop()
    time.sleep(2)
    progress_file.close()
    spark.stop()


# -- the parent: inputs, sampling, report -----------------------------------------------------------
def write_inputs(input_dir: Path, keys: int, touched: int, files: int, seed: int = 42) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    input_dir.mkdir(parents=True)
    rnd = random.Random(seed)
    for b in range(files):
        ks = list(range(keys)) if b == 0 else rnd.sample(range(keys), touched)
        table = pa.table({"key": pa.array(ks, pa.int64()), "value": pa.array([rnd.randrange(1000) for _ in ks])})
        path = input_dir / f"batch-{b:05d}.parquet"
        pq.write_table(table, path)
        os.utime(path, (1_700_000_000 + b, 1_700_000_000 + b))  # the file source orders by mtime


def descendants(pid: int) -> list[int]:
    """Every process under `pid` (not `pid` itself)."""
    children: dict[int, list[int]] = defaultdict(list)
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children[ppid].append(int(proc.name))
    out, stack = [], [pid]
    while stack:
        for c in children.get(stack.pop(), []):
            out.append(c)
            stack.append(c)
    return out


def proc_figures(pids: list[int]) -> tuple[int, int, int, int]:
    """(RSS bytes, open descriptors, threads, RSS bytes of the JVMs among them) summed over `pids`."""
    rss = fds = threads = jvm_rss = 0
    for pid in pids:
        try:
            status = (Path("/proc") / str(pid) / "status").read_text()
            fds += len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            continue
        is_jvm = status.startswith("Name:\tjava")
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                rss += int(line.split()[1]) * 1024
                jvm_rss += int(line.split()[1]) * 1024 if is_jvm else 0
            elif line.startswith("Threads:"):
                threads += int(line.split()[1])
    return rss, fds, threads, jvm_rss


def machine_busy_ticks() -> int:
    """CPU time the whole machine has spent busy (all cores, clock ticks), from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return user + nice + system + irq + softirq + steal


def tree_ticks(pids: list[int]) -> int:
    """CPU time (clock ticks) the processes `pids` have used, with their reaped children's."""
    total = 0
    for pid in pids:
        try:
            stat = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        total += sum(int(x) for x in stat[11:15])  # utime, stime, cutime, cstime
    return total


def own_ticks() -> int:
    """CPU time (clock ticks) this process has used itself (the sampler walking the checkpoint),
    without its children's: the run's processes are counted on their own."""
    stat = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return int(stat[11]) + int(stat[12])  # utime, stime


class Sampler(threading.Thread):
    """Every SAMPLE_S seconds: the figures of every process under the child (its JVM, and the
    JVM's children: our workers), and the checkpoint's files; notes every snapshot file seen."""

    def __init__(self, child_pid: int, state_dir: Path, snapshot_file: re.Pattern[str]) -> None:
        super().__init__(daemon=True)
        self.child_pid, self.state_dir, self.snapshot_file = child_pid, state_dir, snapshot_file
        self.samples: list[dict[str, float]] = []
        self.snapshots: dict[str, set[str]] = defaultdict(set)  # store -> snapshot files seen
        self._done = threading.Event()
        # (time, machine busy, run's processes, this sampler)
        self._ticks: tuple[float, int, int, int] | None = None

    def run(self) -> None:
        while not self._done.wait(SAMPLE_S):
            self.sample()

    def sample(self) -> None:
        pids = [self.child_pid, *descendants(self.child_pid)]
        rss, fds, threads, jvm_rss = proc_figures(pids[1:])
        # CPU the rest of the machine used since the last sample, in cores: above a few percent of
        # a core, other work competed with the run and its timings say less. The sampler's own CPU
        # (walking tens of thousands of checkpoint files) is the bench's cost, reported on its own.
        now, busy, mine, sampler = time.time(), machine_busy_ticks(), tree_ticks(pids), own_ticks()
        other_cores = sampler_cores = float("nan")
        if self._ticks is not None:
            t0, busy0, mine0, sampler0 = self._ticks
            elapsed = max(now - t0, 1e-9) * CLOCK_TICKS
            sampler_cores = (sampler - sampler0) / elapsed
            other_cores = max(0, (busy - busy0) - (mine - mine0) - (sampler - sampler0)) / elapsed
        self._ticks = (now, busy, mine, sampler)
        files = size = 0
        if self.state_dir.exists():
            for dirpath, _, names in os.walk(self.state_dir):
                for n in names:
                    path = os.path.join(dirpath, n)
                    try:
                        size += os.stat(path).st_size
                    except OSError:
                        continue  # deleted by maintenance meanwhile
                    files += 1
                    rel = os.path.relpath(path, self.state_dir)
                    if self.snapshot_file.search(rel):
                        store = "/".join(rel.split("/")[:2])
                        self.snapshots[store].add(rel)
        if rss:
            self.samples.append(
                {
                    "t": now,
                    "rss": rss,
                    "jvm_rss": jvm_rss,
                    "fds": fds,
                    "threads": threads,
                    "files": files,
                    "bytes": size,
                    "other": other_cores,
                    "sampler": sampler_cores,
                }
            )

    def stop(self) -> None:
        self._done.set()
        self.join()


def run_provider(name: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    checkpoint, progress = work / f"ckpt-{name}", work / f"progress-{name}.jsonl"
    gc_log = work / f"gc-{name}.log"
    cmd = [
        sys.executable, __file__, "--child", name, "--input", str(work / "input"), "--checkpoint", str(checkpoint),
        "--progress", str(progress), "--minutes", str(args.minutes), "--partitions", str(args.partitions),
        # the JVM's GC log, for the live heap (after each collection) and GC pauses per window
        f"--driver-java-options={args.driver_java_options} -Xlog:gc:file={gc_log}:utctime,level,tags".strip(),
    ]  # fmt: skip
    print(f"soak: {name} for {args.minutes} min", file=sys.stderr, flush=True)
    child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(work / f"{name}.log", "w"))  # noqa: SIM115
    sampler = Sampler(child.pid, checkpoint / "state", SNAPSHOT_FILE[name])
    sampler.start()
    try:
        code = child.wait(timeout=args.minutes * 60 + 900)
    except subprocess.TimeoutExpired:
        os.kill(child.pid, signal.SIGKILL)
        raise SystemExit(f"{name}: the run did not end; log: {work / f'{name}.log'}") from None
    finally:
        sampler.stop()
    if code != 0:
        raise SystemExit(f"{name}: exit code {code}; log tail:\n{(work / f'{name}.log').read_text()[-3000:]}")
    batches = [json.loads(line) for line in progress.read_text().splitlines() if line.strip()]
    batches = [b for b in batches if b.get("numInputRows", 0) > 0]
    return {"batches": batches, "samples": sampler.samples, "snapshots": sampler.snapshots, "gc": gc_events(gc_log)}


GC_LINE = re.compile(r"^\[([^\]]+)\]\[info\]\[gc\] GC\(\d+\) Pause (\w+).*?(?:\d+M->(\d+)M\(\d+M\) )?([\d.]+)ms$")


def gc_events(log: Path) -> list[list[float]]:
    """[wall time, heap after the collection in MiB (young collections; NaN otherwise), pause ms] of
    every pause in a JVM's GC log (-Xlog:gc with the utctime, level and tags decorators)."""
    events: list[list[float]] = []
    if not log.exists():
        return events
    for line in log.read_text(errors="replace").splitlines():
        m = GC_LINE.match(line)
        if m is None:
            continue
        when = dt.datetime.strptime(m[1], "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()
        after = float(m[3]) if m[2] == "Young" and m[3] else math.nan
        events.append([when, after, float(m[4])])
    return events


def windows(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """Figures per window of WINDOW batches, from a run's raw figures. A trailing partial window of at
    least MIN_PARTIAL batches is kept, marked partial: a provider slower than a window per run would
    otherwise report nothing."""
    out = []
    batches, samples = raw["batches"], raw["samples"]
    chunks = [batches[i : i + WINDOW] for i in range(0, len(batches), WINDOW)]
    for chunk in chunks:
        if len(chunk) < min(WINDOW, MIN_PARTIAL):
            continue
        ts = [dt.datetime.fromisoformat(b["timestamp"].replace("Z", "+00:00")).timestamp() for b in chunk]
        start, end = ts[0], ts[-1] + chunk[-1]["batch_ms"] / 1000
        inside = [s for s in samples if start <= s["t"] <= end] or [min(samples, key=lambda s: abs(s["t"] - end))]
        pauses = [e for e in raw.get("gc", []) if start <= e[0] <= end]
        out.append(
            {
                "first": chunk[0]["id"],
                "last": chunk[-1]["id"],
                "partial": len(chunk) < WINDOW,
                "minutes": (end - start) / 60,
                "commit_ms": statistics.median(b["commit_ms"] for b in chunk),
                "batch_ms": statistics.median(b["batch_ms"] for b in chunk),
                "rss": max(s["rss"] for s in inside),
                # the JVM's share at the sample of the window's peak: heap growth or our workers?
                "jvm_rss": max(inside, key=lambda s: s["rss"]).get("jvm_rss", math.nan),
                "fds": max(s["fds"] for s in inside),
                # Threads: the window's peak, judged by the goal. Spark's cached pools start threads
                # for a burst and end them after 60 s idle, so samples swing by up to a hundred; the
                # median then depends on where the samples fall (4.2 run: 251-307 per window while
                # the peak stayed 315-325). The median is shown beside the peak.
                "threads": max(s["threads"] for s in inside),
                "threads_median": statistics.median(s["threads"] for s in inside),
                # The checkpoint grows between maintenance runs (a minute's versions) and shrinks at
                # each: the median of the window's samples, not the one at its end, says whether it grows.
                "files": statistics.median(s["files"] for s in inside),
                "bytes": statistics.median(s["bytes"] for s in inside),
                "forced": sum(b["forced"] for b in chunk),
                "other": of_known(statistics.mean, (s.get("other", math.nan) for s in inside)),
                # the live heap (median after young collections) and GC pauses, from the GC log
                "heap": of_known(statistics.median, (e[1] for e in pauses)),
                "gc_ms_per_min": sum(e[2] for e in pauses) / max((end - start) / 60, 1e-9)
                if raw.get("gc")
                else math.nan,
                "sampler": of_known(statistics.mean, (s.get("sampler", math.nan) for s in inside)),
            }
        )
    return out


# Our commit's phases (custom metrics, summed over partitions in the progress), in the report's words.
PHASES = [
    ("worker", "WorkerCommit"),
    ("apply", "Apply"),
    ("ingest", "Flush"),
    ("checkpoint", "Checkpoint"),
    ("manifest", "Manifest"),
    ("upload", "Upload"),
    ("bridge", "Bridge"),
]


def commit_phases(raw: dict[str, Any], partitions: int) -> list[str]:
    """Where our commit's time went, per window (medians per partition): a commit p50 that moves
    between windows is traced to a phase. Empty for Spark's provider and runs that kept no phases."""
    batches = raw["batches"]
    if not any(b.get("phases_ms") for b in batches):
        return []
    lines = [
        "  our commit's phases per window (median per partition, ms):",
        f"  {'batches':<12}" + "".join(f"{label:>11}" for label, _ in PHASES),
    ]
    for i in range(0, len(batches), WINDOW):
        chunk = batches[i : i + WINDOW]
        if len(chunk) < min(WINDOW, MIN_PARTIAL):
            continue
        figures = "".join(
            f"{statistics.median(b.get('phases_ms', {}).get(key, 0) for b in chunk) / partitions:>11.2f}"
            for _, key in PHASES
        )
        lines.append(f"  {chunk[0]['id']:>5}-{str(chunk[-1]['id']) + ('*' if len(chunk) < WINDOW else ''):<6}{figures}")
    return lines


def of_known(stat: Callable[[list[float]], float], values: Iterable[float]) -> float:
    """`stat` (statistics.mean, median) of the values that are known (not NaN); NaN when none is."""
    known = [v for v in values if not math.isnan(v)]
    return stat(known) if known else math.nan


def raw_figures(run: dict[str, Any], partitions: int) -> dict[str, Any]:
    """What the report is computed from, small enough to keep beside it."""
    return {
        "batches": [
            {
                "id": b["batchId"],
                "timestamp": b["timestamp"],
                "batch_ms": b["durationMs"]["triggerExecution"],
                "commit_ms": b["stateOperators"][0]["commitTimeMs"] / partitions,
                "forced": b["stateOperators"][0].get("customMetrics", {}).get("pystatestoreSnapshotsForced", 0),
                # where our commit's time goes (phases summed over partitions), to find a drift's cause
                "phases_ms": {
                    name[len("pystatestore") : -len("Ms")]: value
                    for name, value in b["stateOperators"][0].get("customMetrics", {}).items()
                    if name.startswith("pystatestore") and name.endswith("Ms")
                },
            }
            for b in run["batches"]
        ],
        "samples": run["samples"],
        "snapshots_per_store": {store: len(files) for store, files in run["snapshots"].items()},
        "gc": run.get("gc", []),
    }


def growth(ws: list[dict[str, float]], key: str) -> float:
    """The last window's figure over the first steady window's (window 2 of the run)."""
    return ws[-1][key] / max(ws[1][key], 1e-9) if len(ws) >= 2 else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0, help="how long each provider's query runs")
    ap.add_argument("--partitions", type=int, default=200)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--touched-pct", type=float, default=1.0)
    ap.add_argument("--pyspark", help="the Spark minor to run (default: the venv's)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--providers", default=",".join(RUNS), help=f"which of {', '.join(RUNS)} to run (default: both)")
    ap.add_argument(
        "--driver-java-options",
        default=TOUCH_HEAP,
        help=f"extra JVM options of each run's driver (default {TOUCH_HEAP!r}: the whole heap, Spark's default 1 GiB, "
        "is touched at start, so that RSS growth later is not the heap warming up; '' for none)",
    )
    ap.add_argument("--raw", type=Path, help="also write every batch's figures and every sample here (JSON)")
    ap.add_argument(
        "--report-from",
        type=Path,
        metavar="RAW",
        help="run nothing: print the report of an earlier run's --raw file (give that run's other options too)",
    )
    ap.add_argument("--child", choices=list(RUNS), help=argparse.SUPPRESS)
    ap.add_argument("--input", help=argparse.SUPPRESS)
    ap.add_argument("--checkpoint", help=argparse.SUPPRESS)
    ap.add_argument("--progress", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        run_child(args)
        return 0
    if args.pyspark:
        build_jar_module().reexec_under_pyspark(args.pyspark)
    import pyspark

    touched = max(1, int(args.keys * args.touched_pct / 100))
    providers = [p for p in args.providers.split(",") if p]
    unknown = sorted(set(providers) - set(RUNS))
    if unknown or "pss-changelog" not in providers:
        ap.error(f"--providers must name pss-changelog and only {', '.join(RUNS)} (unknown: {unknown})")
    if args.report_from:
        # Re-render a report from a run's raw figures (e.g. after a change to the report itself).
        raws = json.loads(args.report_from.read_text())
        raws.pop("meta", None)
        when = dt.datetime.fromtimestamp(args.report_from.stat().st_mtime, dt.timezone.utc)
        source = f" (report rendered again from the raw figures in {args.report_from})"
    else:
        work = Path(tempfile.mkdtemp(prefix="pss-soak-"))
        # More files than the fastest run can take (a batch takes at least ~0.5 s here).
        write_inputs(work / "input", args.keys, touched, int(args.minutes * 60 / 0.5) + 10)
        raws = {name: raw_figures(run_provider(name, args, work), args.partitions) for name in providers}
        if args.raw:
            args.raw.parent.mkdir(parents=True, exist_ok=True)
            args.raw.write_text(json.dumps(raws))
        if not os.environ.get("PSS_SOAK_KEEP"):
            shutil.rmtree(work, ignore_errors=True)
        when, source = dt.datetime.now(dt.timezone.utc), ""

    lines = [
        f"# pystatestore soak bench, {when:%Y-%m-%d %H:%M} UTC{source}",
        f"# command: .venv/bin/python scripts/bench_soak.py --minutes {args.minutes:g} --partitions "
        f"{args.partitions} --keys {args.keys} --touched-pct {args.touched_pct:g}"
        + (f" --pyspark {args.pyspark}" if args.pyspark else "")
        + (f" --providers {args.providers}" if providers != list(RUNS) else "")
        + (f" --driver-java-options='{args.driver_java_options}'" if args.driver_java_options else ""),
        f"# machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"pyspark {pyspark.__version__}, local[2], {args.partitions} partitions; Spark's defaults otherwise "
        "(maintenance every 60 s, minDeltasForSnapshot 10, minBatchesToRetain 100, coordinator on)",
        f"# workload: a streaming aggregation over {args.keys} keys (all in the first batch), {touched} keys "
        f"updated per batch; each provider's query runs {args.minutes:g} min in its own JVM",
        "# per window of 100 batches: commit p50 per partition, median batch, peak RSS (and the JVM's part of it) "
        "/ descriptors of the JVM and all processes under it, their threads (peak; the median sample beside it), "
        "median checkpoint files and bytes "
        "(sampled every 5 s), and the "
        "mean CPU the rest of the machine (less this bench's sampler) used, in cores "
        f"(above {OTHER_CPU_LIMIT:g}, other work competed "
        "with the run); heap: the JVM's live heap (median after young collections), GC/min: its GC pauses per minute",
        "",
    ]
    table: dict[str, list[dict[str, Any]]] = {}
    for name, raw in raws.items():
        ws = table[name] = windows(raw)
        lines.append(f"{name}: {len(raw['batches'])} batches")
        lines.append(
            f"  {'batches':<12}{'min':>6}{'commit p50':>12}{'batch':>9}{'RSS':>10}{'JVM':>10}{'fds':>6}"
            f"{'threads':>8}{'med':>5}{'ckpt files':>11}{'ckpt MiB':>9}{'forced':>7}"
            f"{'other CPU':>10}{'heap':>9}{'GC/min':>8}"
        )
        for w in ws:
            # runs before 2026-11-26 17:00 did not sample the JVM's part
            jvm = "-" if math.isnan(w["jvm_rss"]) else f"{w['jvm_rss'] / 2**20:.0f} MiB"
            lines.append(
                f"  {w['first']:>5}-{str(w['last']) + ('*' if w['partial'] else ''):<6}{w['minutes']:>6.1f}"
                f"{w['commit_ms']:>10.1f}ms{w['batch_ms']:>7.0f}ms"
                f"{w['rss'] / 2**20:>6.0f} MiB{jvm:>10}{w['fds']:>6}"
                f"{w['threads']:>8}{w['threads_median']:>5.0f}"
                f"{w['files']:>11.0f}{w['bytes'] / 2**20:>9.1f}"
                f"{w['forced']:>7}{w['other']:>9.2f}c"
                + ("" if math.isnan(w["heap"]) else f"{w['heap']:>5.0f} MiB{w['gc_ms_per_min']:>6.0f}ms")
            )
        if any(w["partial"] for w in ws):
            lines.append(f"  * a partial window: the run ended before {WINDOW} more batches")
        versions = len(raw["batches"])
        per_store = sorted(raw["snapshots_per_store"].values()) or [0]
        lines.append(
            f"  snapshots per store (files seen): min {per_store[0]}, median {statistics.median(per_store):g}, "
            f"max {per_store[-1]} over {len(per_store)} stores; {versions} versions / minDeltasForSnapshot "
            f"{MIN_DELTAS} = {versions / MIN_DELTAS:.1f}"
        )
        lines += commit_phases(raw, args.partitions)
        sampler = of_known(statistics.mean, (w["sampler"] for w in ws))
        if not math.isnan(sampler):  # counted apart since 2026-11-26 16:20
            lines.append(f"  this bench's sampler (not in 'other CPU'): mean {sampler:.2f} cores")
        lines.append("")
    # Goals compare windows of at least half a window's batches: a short tail says little.
    ours, theirs = ([w for w in table.get(name, []) if w["last"] - w["first"] + 1 >= WINDOW / 2] for name in RUNS)
    # (text, verdict): True met, False missed, None not measured (too few windows to compare)
    goals: list[tuple[str, bool | None]] = []
    if len(ours) >= 2:
        first_steady, last = ours[1], ours[-1]
        goals.append(
            (
                f"ours: last window's commit p50 {last['commit_ms']:.1f} ms is "
                f"{last['commit_ms'] / first_steady['commit_ms']:.2f}x the first steady window's (goal <= 1.10x)",
                last["commit_ms"] <= 1.1 * first_steady["commit_ms"],
            )
        )
        for key, label in (
            ("rss", "RSS"),
            ("fds", "descriptors"),
            ("threads", "threads"),
            ("bytes", "checkpoint bytes"),
            ("files", "checkpoint files"),
        ):
            g = growth(ours, key)
            split = ""
            if key == "rss" and not math.isnan(ours[-1]["jvm_rss"] + ours[1]["jvm_rss"]):
                # whose memory grew: the JVM's (heap, Spark, our views) or the workers' under it
                jvm = [ours[i]["jvm_rss"] / 2**20 for i in (1, -1)]
                rest = [ours[i]["rss"] / 2**20 - jvm[n] for n, i in enumerate((1, -1))]
                split = f"; the JVM {jvm[0]:.0f} -> {jvm[1]:.0f} MiB, the rest (workers) {rest[0]:.0f} -> {rest[1]:.0f}"
            goals.append(
                (f"ours: {label} last window / first steady window {g:.3f}x (goal <= 1.05x){split}", g <= 1.05)
            )
    else:
        goals.append(
            (f"ours: growth over the run needs two windows of {WINDOW} batches; the run had {len(ours)}", None)
        )
    if ours and theirs:
        ratio = ours[-1]["commit_ms"] / theirs[-1]["commit_ms"]
        goals.append(
            (
                f"ours vs Spark RocksDB changelog, last windows: commit p50 {ratio:.2f}x (goal <= 0.50x), batch "
                f"{ours[-1]['batch_ms'] / theirs[-1]['batch_ms']:.2f}x",
                ratio <= 0.5,
            )
        )
    else:
        goals.append(("ours vs Spark RocksDB changelog: not run, or too few batches for a window", None))
    ours_raw = raws["pss-changelog"]
    per_store = list(ours_raw["snapshots_per_store"].values()) or [0]
    due = len(ours_raw["batches"]) / MIN_DELTAS
    goals.append(
        (
            f"ours: snapshots per store {min(per_store)}-{max(per_store)} against {due:.1f} due (goal: within one)",
            all(abs(n - due) <= 1 for n in per_store),
        )
    )
    forced = sum(b["forced"] for b in ours_raw["batches"])
    goals.append((f"ours: forced snapshots {forced} (goal 0)", forced == 0))
    disturbed = [
        f"{name} {w['first']}-{w['last']} ({w['other']:.2f} cores)"
        for name, ws in table.items()
        for w in ws
        if w["other"] > OTHER_CPU_LIMIT
    ]
    goals.append(
        (
            "a quiet machine: "
            + (f"other work used CPU during {', '.join(disturbed)}" if disturbed else "no window disturbed"),
            not disturbed,
        )
    )
    lines.append("goals:")
    verdicts = {True: "met", False: "MISSED", None: "not measured"}
    lines += [f"  [{verdicts[ok]}] {text}" for text, ok in goals]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
