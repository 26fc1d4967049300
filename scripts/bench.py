"""Benchmark: one streaming aggregation on Spark's HDFS and RocksDB providers (with and without
changelog checkpointing) and on pystatestore (changelog and snapshot commits), in one run.

Workload: a state of N keys (loaded by the first micro-batch), then B micro-batches each updating
X% of the keys (random keys, one file per batch through the file source), with Spark's retention
(minBatchesToRetain=5) and maintenance every 2 s for every provider, as a user runs them. Reported
per provider: the median steady micro-batch time and commit latency (p50 per partition), bytes the
state store wrote per steady batch (every file that appeared, seen by a watcher), the checkpoint's
file count and bytes at the end, and the restart batch (median of three: each a new query in a new
JVM on the checkpoint with one more input file), with where it restored its state from and how many
changelog versions pystatestore replayed. Ratios are against pystatestore's default (changelog) mode.

Like with like: every query runs in a JVM of its own (a provider never inherits another's warm JIT,
page cache of its own files, or loaded state), and with --repeat R the providers run R times in
rotating order (repeat i starts i providers later), so no provider always goes first or last; the
report gives the median over repeats and each figure's range. A restart in a new JVM is a driver
restart on the same host: Spark's providers load from the checkpoint (their local working copies
live in the dead JVM's temporary directory); pystatestore restores from its local recovery copies
when they are intact, and the report says how many bytes came from each.

    .venv/bin/python scripts/bench.py [--keys 100000] [--touched-pct 1] [--batches 20] [--partitions 4]
                                      [--repeat 3] [--pyspark 4.1|4.2|4.3]
                                      [--workload aggregation|tws|sessions|flatmap-sessions]
                                      [--runs NAME,...] [--out FILE]

--workload tws (Spark 4.1: 4.2+ refuse transformWithState on any provider but their RocksDB one) runs
a transformWithStateInPandas session buffer instead: per key a count (ValueState), its events
(ListState, appended to) and an event-time timer an hour after the key's newest event (moved on each
input: the timer and its ValueState), with a watermark on the events' time; Spark's HDFS provider
has no column families and sits out.

--workload sessions runs applyInPandasWithState keeping a session's event buffer per key: a count and
its newest 64 events of 64 bytes each as one string, about 4 KiB of state per key (a new key starts
from 64 events of history), rewritten whenever the key has input: the large-value case.
--workload flatmap-sessions keeps the same state with a Scala flatMapGroupsWithState
(scripts/jvm/SessionBuffers.scala, compiled with the running Spark's own Scala compiler): the same
case with no Python UDF workers, so the state store's share of a batch shows.

--pyspark runs the whole benchmark on that Spark minor (its pyspark, installed once per machine by
scripts/build_jar.py, and our jar for it) against that minor's own built-in providers.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib.build import reexec_under_pyspark
from benchlib.progress import batch_ms, custom_metric, started_at
from benchlib.providers import FORMAT_CONF, HDFS, PROVIDERS, PSS, add_ours_from, sql_conf
from benchlib.queries import RESTARTS, WARMUP_BATCHES, WORKLOAD_TEXT, WORKLOADS, compile_session_buffers, write_inputs
from benchlib.query import MAINTENANCE, PARTITIONS, RETAIN, run_query_in_own_jvm
from benchlib.repeats import medians_over, range_text, spread_rotation
from benchlib.report import code_version, provenance, watching_load, write_report
from benchlib.samplers import Sampler
from pystatestore.spark_minors import BUILT_AGAINST


def our_runs() -> tuple[str, ...]:
    return tuple(name for name, provider in PROVIDERS.items() if provider.ours)


BASELINES = ("hdfs", "rocksdb", "rocksdb-changelog")
# Durable first (decision 0032), the SST, ingest and checkpoint come after the worker's reply, and
# the next batch's first read of the store waits for them if they are not done; otherwise (snapshot
# mode, durableFirstCommit=false) they are part of the commit and the segment is written with the SST.
BREAKDOWN = [
    ("write the changes as a segment", "pystatestoreSegmentMs"),
    ("upload new files", "pystatestoreUploadMs"),
    ("write manifest", "pystatestoreManifestMs"),
    ("Python worker total, until its reply", "pystatestoreWorkerCommitMs"),
    ("the call to the worker, seen by the JVM", "pystatestoreWorkerCallMs"),
    ("JVM: write Arrow change frame", "pystatestoreBridgeMs"),
    ("JVM after the reply (cache, coordinator)", "pystatestoreJvmAfterReplyMs"),
    ("whole commit seen by the task", "pystatestoreCommitMs"),
    ("SST of the changes (+segment if not durable first)", "pystatestoreApplyMs"),
    ("ingest it into RocksDB", "pystatestoreFlushMs"),
    ("native checkpoint (the read view)", "pystatestoreCheckpointMs"),
    ("worker time after the reply (durable first)", "pystatestoreDeferredApplyMs"),
    ("next batch's reads waiting for that view", "pystatestoreViewWaitMs"),
]
# pystatestore's metrics of a restart batch: where its state came from
RESTORE_METRICS = {
    "replayed_versions": "pystatestoreRestoreChangelogVersions",
    "restore_local_bytes": "pystatestoreRestoreLocalBytes",
    "restore_remote_bytes": "pystatestoreRestoreRemoteBytes",
    "restore_inline_bytes": "pystatestoreRestoreInlineBytes",
    "restore_remote_files": "pystatestoreRestoreRemoteFiles",
    "restore_worker_ms": "pystatestoreRestoreMs",
}


def state_files(state_dir: Path) -> dict[str, int]:
    """Every file of the state stores (Spark's small _metadata files excluded): path -> size."""
    out = {}
    for p in state_dir.rglob("*"):
        try:
            if p.is_file() and "_metadata" not in p.parts:
                out[str(p)] = p.stat().st_size
        except FileNotFoundError:  # deleted by maintenance while we looked
            continue
    return out


class FileWatcher(Sampler):
    """Notes every file that appears under `root` (and its largest size), every 0.2 s, so bytes
    written count files that maintenance deletes later in the run."""

    interval = 0.2

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root
        self.first_seen: dict[str, tuple[float, int]] = {}

    def sample(self) -> None:
        if not self.root.exists():
            return
        now = time.time()
        for path, size in state_files(self.root).items():
            seen, biggest = self.first_seen.get(path, (now, 0))
            self.first_seen[path] = (seen, max(biggest, size))

    def stop(self) -> None:
        super().stop()
        self.sample()

    def bytes_since(self, since: float) -> int:
        return sum(size for seen, size in self.first_seen.values() if seen >= since)


def commit_floor_ms(size: int, directory: Path, writes: int = 200) -> float:
    """The physical floor of a commit that writes `size` bytes: p50 of writing a new file of that
    size in `directory` (the checkpoint's disk) and fsyncing it, measured here and now."""
    data = os.urandom(max(int(size), 1))
    times = []
    for i in range(writes):
        path = directory / f"floor-{i}"
        started = time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        times.append((time.perf_counter() - started) * 1000)
        path.unlink()
    return statistics.median(times)


def run_provider(
    name: str,
    input_dir: Path,
    work: Path,
    repeat: int,
    partitions: int = PARTITIONS,
    checkpoint_format: int = 1,
    workload: str = "aggregation",
    restarts: int = RESTARTS,
    session_conf: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One provider's load, steady batches and restarts on a fresh checkpoint, each query in its own JVM."""
    ours = PROVIDERS[name].ours
    tag = f"{name}-r{repeat}"
    checkpoint = work / f"ckpt-{tag}"
    restart_input = work / f"input-{tag}"
    shutil.copytree(input_dir, restart_input)
    # Our local recovery copies for this run only, so that the next run starts without them.
    local = {PSS + "localRecoveryDir": str(work / f"recovery-{tag}")} if ours else {}
    conf = sql_conf(name, {FORMAT_CONF: str(checkpoint_format), **local})
    watcher = FileWatcher(checkpoint / "state")
    watcher.start()
    started = time.time()
    try:
        progress, spark_version = run_query_in_own_jvm(
            work,
            tag,
            conf,
            restart_input,
            checkpoint,
            partitions=partitions,
            linger_s=5.0,
            workload=workload,
            session_conf=session_conf,
        )
    finally:
        watcher.stop()
    files = state_files(checkpoint / "state")
    steady = progress[1 + WARMUP_BATCHES :]
    commit_ms = [p["stateOperators"][0]["commitTimeMs"] / partitions for p in steady]
    result: dict[str, Any] = {
        "spark": spark_version,
        "batch_ms": statistics.median(batch_ms(p) for p in steady),
        "commit_ms": statistics.median(commit_ms),
        "bytes_per_batch": watcher.bytes_since(started_at(steady[0]) - 0.5) / len(steady),
        "checkpoint_bytes": sum(files.values()),
        "checkpoint_files": len(files),
        "state_rows": progress[-1]["stateOperators"][0]["numRowsTotal"],
        "wall_s": time.time() - started,
    }
    if ours:
        for _, key in BREAKDOWN:
            result[key] = statistics.median(max(custom_metric(p, key, 0), 0) / partitions for p in steady)
        result["files_uploaded"] = statistics.median(custom_metric(p, "pystatestoreFilesUploaded", 0) for p in steady)
        result["files_inline"] = statistics.median(custom_metric(p, "pystatestoreFilesInline", 0) for p in steady)
        # What one partition's commit writes (its changes, inline or in a file, and its manifest).
        result["commit_bytes"] = statistics.median(
            max(custom_metric(p, "pystatestoreBytesWritten", 0), 0) / partitions for p in steady
        )
    # The restarts: each a new query in a new JVM on the same checkpoint processes one more file; its
    # first batch rebuilds every partition's state. One restart batch varied by ±20% between runs,
    # so the report takes the median of `restarts` of them (RESTARTS by default).
    restart_reports = []
    for i in range(restarts):
        target = restart_input / f"batch-restart-{i}.parquet"
        shutil.copy(input_dir.parent / "restart-input" / target.name, target)
        os.utime(target, (1_800_000_000 + 10 * i, 1_800_000_000 + 10 * i))
        first = run_query_in_own_jvm(
            work,
            f"{tag}-restart{i}",
            conf,
            restart_input,
            checkpoint,
            partitions=partitions,
            workload=workload,
            session_conf=session_conf,
        )[0][0]
        restart_reports.append(first)
    result["restart_ms"] = statistics.median(batch_ms(r) for r in restart_reports)
    for key, metric in RESTORE_METRICS.items():
        result[key] = statistics.median(custom_metric(r, metric) for r in restart_reports)
    shutil.rmtree(checkpoint, ignore_errors=True)
    shutil.rmtree(restart_input, ignore_errors=True)
    shutil.rmtree(work / f"recovery-{tag}", ignore_errors=True)
    return result


def restored_from(name: str, r: dict[str, Any]) -> str:
    """Where a restart batch's state came from, in a few words."""
    if not PROVIDERS[name].ours:
        return "checkpoint (new JVM)"
    return (
        f"local {r['restore_local_bytes'] / 1024:.0f} KiB, ckpt {r['restore_remote_bytes'] / 1024:.0f} KiB "
        f"files + {max(r['restore_inline_bytes'], 0) / 1024:.0f} KiB inside manifests, "
        f"worker {r['restore_worker_ms']:.0f} ms"
    )


def report(
    results: dict[str, dict[str, Any]], floors: dict[str, float], args: argparse.Namespace, orders: list[list[str]]
) -> list[str]:
    """The tables (medians, ranges, ratios) and where our commits' time went."""
    touched = max(1, int(args.keys * args.touched_pct / 100))
    lines = [
        "runs:",
        *(f"  {name:<19}{PROVIDERS[name].commits}" for name in results),
        "",
        f"{'run':<19}{'batch ms':>9}{'commit p50':>11}{'written/batch':>15}{'ckpt files':>11}{'ckpt size':>11}"
        f"{'restart ms':>11}{'replayed':>9}  restored from",
    ]
    for name, r in results.items():
        replayed = f"{r['replayed_versions']:>9.0f}" if r["replayed_versions"] >= 0 else f"{'-':>9}"
        lines.append(
            f"{name:<19}{r['batch_ms']:>9.0f}{r['commit_ms']:>9.1f}ms{r['bytes_per_batch'] / 1024:>11.1f} KiB"
            f"{r['checkpoint_files']:>11.0f}{r['checkpoint_bytes'] / 2**20:>7.1f} MiB{r['restart_ms']:>11.0f}{replayed}"
            f"  {restored_from(name, r)}"
        )
    lines += [
        "",
        "(commit p50: per partition per batch; replayed: changelog versions pystatestore replayed on top of",
        "snapshots to rebuild all partitions in a restart batch; restart ms, replayed and restored bytes: medians",
        f"of {args.restarts} restarts; Spark's providers restore from the checkpoint, their local copies died with",
        "the JVM; ours from the local recovery copies on this host, and the checkpoint for anything they lack;",
        "worker: the time our workers spent restoring, all partitions together; the rest of a restart batch is",
        "a new JVM's first batch)",
        "",
        f"range over the {args.repeat} repeats (min-max):",
        f"{'run':<19}{'batch ms':>14}{'commit p50 ms':>16}{'restart ms':>14}",
    ]
    for name, r in results.items():
        lines.append(
            f"{name:<19}{range_text(r, 'batch_ms', '.0f'):>14}{range_text(r, 'commit_ms', '.1f'):>16}"
            f"{range_text(r, 'restart_ms', '.0f'):>14}"
        )
    lines += ["", "ratios (ours / built-in; < 1 means ours is lower):"]
    for ours_name in [n for n in our_runs() if n in results]:
        ours = results[ours_name]
        for name in [n for n in BASELINES if n in results]:
            r = results[name]
            lines.append(
                f"  {ours_name:<13} vs {name:<17} batch {ours['batch_ms'] / r['batch_ms']:.2f}x  "
                f"commit p50 {ours['commit_ms'] / max(r['commit_ms'], 0.1):.2f}x  "
                f"written/batch {ours['bytes_per_batch'] / max(r['bytes_per_batch'], 1):.2f}x  "
                f"files {ours['checkpoint_files'] / max(r['checkpoint_files'], 1):.2f}x  "
                f"bytes {ours['checkpoint_bytes'] / max(r['checkpoint_bytes'], 1):.2f}x  "
                f"restart {ours['restart_ms'] / max(r['restart_ms'], 1):.2f}x"
            )
    for ours_name in [n for n in our_runs() if n in results]:
        ours = results[ours_name]
        lines += [
            "",
            f"where {ours_name}'s commit time goes (median per partition per batch, from its custom metrics;",
            f"median files uploaded {ours['files_uploaded']:.0f}, stored inline {ours['files_inline']:.0f} "
            "per batch over all partitions):",
        ]
        lines += [f"  {label:<40}{ours[key]:>7.1f} ms" for label, key in BREAKDOWN]
        lines.append(
            f"  the floor: write + fsync of {ours['commit_bytes']:,.0f} bytes (what a commit wrote, median) on the "
            f"checkpoint's disk, p50 of 200: {floors[ours_name]:.2f} ms; ours is "
            f"{ours['commit_ms'] / max(floors[ours_name], 0.001):.1f}x it"
        )
    return [
        f"# workload: {WORKLOAD_TEXT[args.workload]}; {args.keys} keys of state, {touched} keys ({args.touched_pct}%) "
        "updated per batch, "
        f"{args.batches} batches; medians over batches {WARMUP_BATCHES + 1}..{args.batches}; then "
        f"{args.restarts} restarts (median), each a new query in a new JVM",
        f"# every query in a JVM of its own; {args.repeat} repeats in rotating order ("
        + "; ".join(", ".join(order) for order in orders)
        + "); figures are medians over the repeats",
        "",
        *lines,
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--touched-pct", type=float, default=1.0)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--partitions", type=int, default=PARTITIONS, help="shuffle partitions (Spark's default: 200)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of every provider, in rotating order")
    ap.add_argument(
        "--restarts", type=int, choices=range(1, RESTARTS + 1), default=RESTARTS, help="restarts per run (median)"
    )
    ap.add_argument("--out", type=Path, default=None, help="also write the report here")
    ap.add_argument("--pyspark", choices=list(BUILT_AGAINST), help="the Spark minor to run (default: the venv's)")
    ap.add_argument(
        "--checkpoint-format",
        type=int,
        choices=(1, 2),
        default=1,
        help="Spark's state checkpoint format (2: checkpoint ids; Spark's HDFS provider has none, so it sits out)",
    )
    ap.add_argument(
        "--workload",
        choices=list(WORKLOADS),
        default="aggregation",
        help="tws: a transformWithStateInPandas session buffer (ListState, a ValueState, event-time timers); 4.1 "
        "only. sessions: applyInPandasWithState keeping about 4 KiB of events per key (large values); "
        "flatmap-sessions: the same state kept by a Scala flatMapGroupsWithState",
    )
    ap.add_argument(
        "--runs",
        default=None,
        help=f"comma-separated runs to compare (default: every one the workload and format allow): "
        f"{', '.join(PROVIDERS)}",
    )
    ap.add_argument(
        "--ours-from",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="a run NAME of pystatestore's default commits whose state workers import the package from DIR "
        "(another checkout's python/): two versions of the worker in one run (the jar is this checkout's)",
    )
    args = ap.parse_args()
    for variant in args.ours_from:
        try:
            add_ours_from(variant)
        except ValueError as e:
            ap.error(str(e))
    reexec_under_pyspark(args.pyspark)
    code = code_version()
    touched = max(1, int(args.keys * args.touched_pct / 100))
    work = Path(tempfile.mkdtemp(prefix="pss-bench-"))
    write_inputs(work / "input", args.keys, touched, args.batches)
    session_conf = {"spark.jars": str(compile_session_buffers(work))} if args.workload == "flatmap-sessions" else None

    # Spark's HDFS provider has no checkpoint ids (format 2) and no column families (transformWithState).
    names = [
        n for n, p in PROVIDERS.items() if (args.checkpoint_format == 1 and args.workload != "tws") or p.cls != HDFS
    ]
    if args.runs:
        asked = args.runs.split(",")
        if unknown := [n for n in asked if n not in names]:
            raise SystemExit(f"bench: --runs {','.join(unknown)}: not among {', '.join(names)} for this workload")
        names = [n for n in names if n in asked]
    per_run: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    orders = [spread_rotation(names, repeat, args.repeat) for repeat in range(args.repeat)]
    with watching_load() as load:
        for repeat, order in enumerate(orders):
            for name in order:
                print(f"bench: repeat {repeat + 1}/{args.repeat}: {name}", flush=True)
                load.phase = name
                per_run[name].append(
                    run_provider(
                        name,
                        work / "input",
                        work,
                        repeat,
                        args.partitions,
                        args.checkpoint_format,
                        args.workload,
                        args.restarts,
                        session_conf,
                    )
                )
        results = {name: {"spark": runs[0]["spark"], **medians_over(runs)} for name, runs in per_run.items()}
        load.phase = "the floor"
        floors = {name: commit_floor_ms(results[name]["commit_bytes"], work) for name in our_runs() if name in results}
    shutil.rmtree(work, ignore_errors=True)
    spark_version = results[names[0]]["spark"]

    command = (
        f".venv/bin/python scripts/bench.py --keys {args.keys} --touched-pct {args.touched_pct} "
        f"--batches {args.batches} --partitions {args.partitions} --repeat {args.repeat}"
        + (f" --pyspark {args.pyspark}" if args.pyspark else "")
        + (f" --checkpoint-format {args.checkpoint_format}" if args.checkpoint_format != 1 else "")
        + (f" --workload {args.workload}" if args.workload != "aggregation" else "")
        + (f" --runs {args.runs}" if args.runs else "")
        + (f" --restarts {args.restarts}" if args.restarts != RESTARTS else "")
        + "".join(f" --ours-from {variant}" for variant in args.ours_from)
    )
    code_line, load_line = provenance(code, load)
    lines = [
        f"# pystatestore bench, {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"# command: {command}",
        code_line,
        f"# machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"Spark {spark_version}, local[2], {args.partitions} partitions, minBatchesToRetain={RETAIN}, "
        f"maintenance every {MAINTENANCE[:-1]} s, checkpointFormatVersion={args.checkpoint_format}",
        load_line,
        *report(results, floors, args, orders),
    ]
    write_report("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    sys.exit(main())
