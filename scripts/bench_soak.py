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
import os
import platform
import re
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchlib.build import reexec_under_pyspark
from benchlib.child import hidden_options, run_child, script_argv
from benchlib.inputs import write_update_files
from benchlib.jvm import gc_events, gc_log_option
from benchlib.procfs import subtree, usage
from benchlib.providers import sql_conf
from benchlib.report import code_version, provenance, watching_load, write_report
from benchlib.samplers import OTHER_CPU_LIMIT, CpuLoad, Sampler
from soaklib.report import report_lines

RUNS = ("pss-changelog", "rocksdb-changelog")  # benchlib.providers' names; Spark's defaults otherwise
SAMPLE_S = 5.0
# A measurement setting, not a tuning: a JVM's RSS grows as its heap is first touched, over minutes
# (both providers' JVMs grew by ~300 MiB around minute 10 of a 30-minute run); touching the whole
# heap (Spark's default spark.driver.memory) at start leaves growth that is the run's own.
TOUCH_HEAP = "-Xms1g -XX:+AlwaysPreTouch"
# A snapshot file of each provider: ours in changelog mode, Spark RocksDB's.
SNAPSHOT_FILE = {
    "pss-changelog": re.compile(r"snapshots/(\d+)-[0-9a-f]+\.json$"),
    "rocksdb-changelog": re.compile(r"(?:^|/)(\d+)(?:_[0-9a-f-]+)?\.zip$"),
}


# -- the child: one provider, one JVM ---------------------------------------------------------------
def child(args: argparse.Namespace) -> None:
    from benchlib.session import record_progress, run_count_until, start_session

    session = {"spark.driver.extraJavaOptions": args.driver_java_options} if args.driver_java_options else {}
    spark = start_session(
        f"pystatestore-soak-{args.child}", partitions=args.partitions, sql_conf=sql_conf(args.child), **session
    )
    progress_file = record_progress(spark, Path(args.progress))
    run_count_until(spark, args.input, args.checkpoint, args.minutes, args.child)
    time.sleep(2)
    progress_file.close()
    spark.stop()


# -- the parent: inputs, sampling, report -----------------------------------------------------------
class CheckpointSampler(Sampler):
    """Every SAMPLE_S seconds: the figures of every process under the child (its JVM, and the
    JVM's children: our workers), the CPU the rest of the machine used meanwhile, and the
    checkpoint's files; notes every snapshot file seen."""

    interval = SAMPLE_S

    def __init__(self, child_pid: int, state_dir: Path, snapshot_file: re.Pattern[str]) -> None:
        super().__init__()
        self.child_pid, self.state_dir, self.snapshot_file = child_pid, state_dir, snapshot_file
        self.samples: list[dict[str, float]] = []
        self.snapshots: dict[str, set[str]] = defaultdict(set)  # store -> snapshot files seen
        self.cpu = CpuLoad()

    def sample(self) -> None:
        pids = subtree(self.child_pid)
        figures = usage(pids[1:])
        # The sampler's own CPU (walking tens of thousands of checkpoint files) is the bench's
        # cost, reported on its own.
        other_cores, sampler_cores = self.cpu.read(pids)
        now = time.time()
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
        if figures.rss:
            self.samples.append(
                {
                    "t": now,
                    "rss": figures.rss,
                    "jvm_rss": figures.jvm_rss,
                    "fds": figures.fds,
                    "threads": figures.threads,
                    "files": files,
                    "bytes": size,
                    "other": other_cores,
                    "sampler": sampler_cores,
                }
            )


def run_provider(name: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    checkpoint, progress = work / f"ckpt-{name}", work / f"progress-{name}.jsonl"
    gc_log = work / f"gc-{name}.log"
    cmd = script_argv(
        __file__,
        child=name,
        input=work / "input",
        checkpoint=checkpoint,
        progress=progress,
        minutes=args.minutes,
        partitions=args.partitions,
        # the JVM's GC log, for the live heap (after each collection) and GC pauses per window
        driver_java_options=f"{args.driver_java_options} {gc_log_option(gc_log)}".strip(),
    )
    print(f"soak: {name} for {args.minutes} min", file=sys.stderr, flush=True)
    log = work / f"{name}.log"
    run = run_child(
        cmd,
        timeout=args.minutes * 60 + 900,
        log=log,
        watch=lambda pid: [CheckpointSampler(pid, checkpoint / "state", SNAPSHOT_FILE[name])],
    )
    if run.timed_out:
        raise SystemExit(f"{name}: the run did not end; log: {log}")
    if run.returncode != 0:
        raise SystemExit(f"{name}: exit code {run.returncode}; log tail:\n{log.read_text()[-3000:]}")
    sampler = run.watchers[0]
    batches = [json.loads(line) for line in progress.read_text().splitlines() if line.strip()]
    batches = [b for b in batches if b.get("numInputRows", 0) > 0]
    return {"batches": batches, "samples": sampler.samples, "snapshots": sampler.snapshots, "gc": gc_events(gc_log)}


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
    hidden_options(ap, "--input", "--checkpoint", "--progress")
    args = ap.parse_args()
    if args.child:
        child(args)
        return 0
    reexec_under_pyspark(args.pyspark)
    import pyspark

    touched = max(1, int(args.keys * args.touched_pct / 100))
    providers = [p for p in args.providers.split(",") if p]
    unknown = sorted(set(providers) - set(RUNS))
    if unknown or "pss-changelog" not in providers:
        ap.error(f"--providers must name pss-changelog and only {', '.join(RUNS)} (unknown: {unknown})")
    if args.report_from:
        # Re-render a report from a run's raw figures (e.g. after a change to the report itself).
        raws = json.loads(args.report_from.read_text())
        meta = raws.pop("meta", {})  # runs before 2026-12-05 kept none
        when = dt.datetime.fromtimestamp(args.report_from.stat().st_mtime, dt.timezone.utc)
        source = f" (report rendered again from the raw figures in {args.report_from})"
    else:
        code = code_version()
        work = Path(tempfile.mkdtemp(prefix="pss-soak-"))
        # More files than the fastest run can take (a batch takes at least ~0.5 s here).
        write_update_files(work / "input", args.keys, touched, int(args.minutes * 60 / 0.5) + 10)
        raws = {}
        with watching_load() as load:
            for name in providers:
                load.phase = name
                raws[name] = raw_figures(run_provider(name, args, work), args.partitions)
        meta = dict(zip(("code", "load"), provenance(code, load), strict=True))
        if args.raw:
            args.raw.parent.mkdir(parents=True, exist_ok=True)
            args.raw.write_text(json.dumps({**raws, "meta": meta}))
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
        *([meta["code"]] if "code" in meta else []),
        f"# machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"pyspark {pyspark.__version__}, local[2], {args.partitions} partitions; Spark's defaults otherwise "
        "(maintenance every 60 s, minDeltasForSnapshot 10, minBatchesToRetain 100, coordinator on)",
        *([meta["load"]] if "load" in meta else []),
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
    lines += report_lines(raws, args.partitions)
    write_report("\n".join(lines) + "\n", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
