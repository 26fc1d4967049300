"""Where a steady micro-batch's CPU goes, per provider: bench.py's workload (aggregation or
transformWithState) in a JVM of its own per provider, with the CPU time of every process and every
JVM thread sampled from /proc through the steady batches, and a Java Flight Recorder profile of the
JVM whose samples are attributed to the state store (our shim, Spark's RocksDB provider and
rocksdbjni) or to everything else.

The question it answers: how much of a batch could a faster state store save at all? A referee
apart from the providers' own metrics: it reads /proc and the JVM's sampler, not our counters.

    .venv/bin/python scripts/profile_batches.py [--workload tws] [--keys 100000] [--touched-pct 1]
        [--batches 12] [--partitions 4] [--runs rocksdb-changelog,pss-changelog] [--pyspark 4.1] [--out FILE]
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib.build import reexec_under_pyspark
from benchlib.procfs import cpu_seconds, kind_of, subtree
from benchlib.progress import batch_ms, started_at
from benchlib.providers import PSS, sql_conf
from benchlib.queries import WARMUP_BATCHES, WORKLOAD_TEXT, compile_session_buffers, write_inputs
from benchlib.query import run_query_in_own_jvm
from benchlib.report import code_version, provenance, watching_load, write_report
from benchlib.samplers import LoadMonitor, Sampler
from pystatestore.spark_minors import BUILT_AGAINST

# A JFR stack frame belongs to the state store when its class is one of these.
STORE_FRAMES = (
    "org.pystatestore.",
    "org.rocksdb.",
    "org.apache.spark.sql.execution.streaming.state.RocksDB",
    "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStore",
    "org.apache.spark.sql.execution.streaming.state.StateStoreChangelog",
)


def thread_group(comm: str) -> str:
    """A JVM thread's group, from its name (Linux keeps the first 15 characters)."""
    for prefix, group in (
        ("Executor task", "task threads"),
        ("stateConnectionListenerThread"[:15], "transformWithState state server"),
        ("stream executio", "query's stream execution thread"),
        ("rocksdb:", "RocksDB background threads"),
        ("stateStore", "state store maintenance"),
        ("state-store", "state store maintenance"),
        ("C2 Compiler", "JIT compilers"),
        ("C1 Compiler", "JIT compilers"),
        ("GC Thread", "GC"),
        ("G1 ", "GC"),
        ("VM Thread", "GC"),
    ):
        if comm.startswith(prefix):
            return group
    return "other JVM threads"


class CpuSampler(Sampler):
    """Every 0.5 s: the CPU seconds of each process under `parent`, by kind, and of each JVM thread,
    by group. Dead processes keep their last value, so a sum over a window is right."""

    interval = 0.5

    def __init__(self, parent: int) -> None:
        super().__init__()
        self.parent = parent
        self.samples: list[tuple[float, dict[str, float]]] = []
        self.last: dict[tuple[int, int], tuple[str, float]] = {}

    def sample(self) -> None:
        for pid in subtree(self.parent):
            try:
                kind = kind_of(pid)
                if kind == "jvm":
                    for task in Path(f"/proc/{pid}/task").iterdir():
                        comm, cpu = cpu_seconds(task / "stat")
                        self.last[(pid, int(task.name))] = ("jvm: " + thread_group(comm), cpu)
                else:
                    label = {"worker": "pystatestore worker", "python": "PySpark's Python workers"}[kind]
                    if pid == self.parent:
                        label = "Python driver (the query's process)"
                    self.last[(pid, 0)] = (label, cpu_seconds(Path(f"/proc/{pid}/stat"))[1])
            except (OSError, ValueError):
                continue
        totals: dict[str, float] = collections.defaultdict(float)
        for label, cpu in self.last.values():
            totals[label] += cpu
        self.samples.append((time.time(), dict(totals)))

    def between(self, start: float, end: float) -> dict[str, float]:
        """CPU seconds per label spent between two wall-clock times (nearest samples)."""
        before = max((s for s in self.samples if s[0] <= start), key=lambda s: s[0], default=self.samples[0])
        after = min((s for s in self.samples if s[0] >= end), key=lambda s: s[0], default=self.samples[-1])
        return {k: v - before[1].get(k, 0.0) for k, v in after[1].items()}


def jfr_shares(recording: Path, start: float, end: float) -> tuple[dict[str, int], dict[str, int]]:
    """JFR execution samples (threads running Java code) taken between `start` and `end`: per thread
    (pool numbers folded) whether a state-store frame was on the stack; and the store's frames
    nearest the top of those stacks."""
    for _ in range(60):  # the JVM writes the recording as it exits, after the query's process ended
        printed = subprocess.run(
            ["jfr", "print", "--json", "--events", "jdk.ExecutionSample", str(recording)],
            capture_output=True,
            text=True,
        )
        if printed.returncode == 0:
            break
        time.sleep(1)
    else:
        raise SystemExit(f"profile: jfr could not read {recording}: {printed.stderr.strip()[-500:]}")
    out = printed.stdout
    by_thread: dict[str, int] = collections.Counter()
    store_tops: dict[str, int] = collections.Counter()
    for event in json.loads(out)["recording"]["events"]:
        values = event["values"]
        if not start <= dt.datetime.fromisoformat(values["startTime"]).timestamp() <= end:
            continue
        thread = re.sub(r"[-\d]+$|\[.*", "", (values.get("sampledThread") or {}).get("javaName") or "?").strip()
        frames = [
            f["method"]["type"]["name"].replace("/", ".") + "." + f["method"]["name"]
            for f in (values.get("stackTrace") or {}).get("frames", [])
        ]
        store = [f for f in frames if f.startswith(STORE_FRAMES)]
        by_thread[f"{thread}: {'store' if store else 'not store'}"] += 1
        if store:
            store_tops[re.sub(r"\$\$Lambda.*", "$$Lambda", store[0])] += 1
    return dict(by_thread), dict(store_tops)


def profile(name: str, args: argparse.Namespace, work: Path, input_dir: Path, jars: dict[str, str]) -> dict:
    recording = work / f"{name}.jfr"
    samplers: list[CpuSampler] = []

    def watch(pid: int) -> list[CpuSampler]:
        samplers.append(CpuSampler(pid))  # kept here: the query's run gives back only its progress
        return samplers

    progress, _ = run_query_in_own_jvm(
        work,
        name,
        sql_conf(name, {PSS + "localRecoveryDir": str(work / f"recovery-{name}")}),
        input_dir,
        work / f"ckpt-{name}",
        partitions=args.partitions,
        linger_s=1.0,
        session_conf={
            "spark.driver.extraJavaOptions": f"-XX:StartFlightRecording=filename={recording},settings=profile",
            **jars,
        },
        workload=args.workload,
        watch=watch,
    )
    steady = progress[1 + WARMUP_BATCHES :]
    start, end = started_at(steady[0]), started_at(steady[-1]) + batch_ms(steady[-1]) / 1000
    batches = sorted(batch_ms(p) for p in steady)
    return {
        "name": name,
        "batches": len(steady),
        "wall_s": end - start,
        "median_batch_ms": batches[len(batches) // 2],
        "commit_ms": sum(p["stateOperators"][0]["commitTimeMs"] for p in steady) / len(steady),
        "cpu": samplers[0].between(start, end),
        "jfr": (shares := jfr_shares(recording, start, end))[0],
        "jfr_store_tops": shares[1],
    }


def report(results: list[dict], args: argparse.Namespace, code: str, load: LoadMonitor) -> str:
    import pyspark

    code_line, load_line = provenance(code, load)
    lines = [
        f"# pystatestore batch profile, {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
        "# command: .venv/bin/python scripts/profile_batches.py " + " ".join(sys.argv[1:]),
        code_line,
        f"# machine: {platform.machine()}, {os.cpu_count()} cores, Spark {pyspark.__version__}, local[2], "
        f"{args.partitions} partitions",
        load_line,
        f"# workload: {WORKLOAD_TEXT[args.workload]}; {args.keys} keys, {args.touched_pct}% touched per batch; "
        f"batches {WARMUP_BATCHES + 2}..{args.batches} profiled",
        "# CPU: user+system seconds per steady batch from /proc, by process kind and JVM thread group;",
        "# JFR: the JVM's execution samples (threads running Java code), per thread, split by whether a state-store"
        " frame is on the stack (shares under 0.5% left out)",
        "",
    ]
    for r in results:
        n = r["batches"]
        lines.append(
            f"{r['name']}: median batch {r['median_batch_ms']} ms, commitTimeMs (all partitions) "
            f"{r['commit_ms']:.0f} ms per batch, {r['wall_s'] / n:.2f} s wall per batch"
        )
        total = sum(r["cpu"].values())
        for label, cpu in sorted(r["cpu"].items(), key=lambda kv: -kv[1]):
            lines.append(f"  CPU {label:<40} {cpu / n * 1000:8.0f} ms/batch  {cpu / total:6.1%}")
        lines.append(f"  CPU {'all':<40} {total / n * 1000:8.0f} ms/batch")
        jfr_total = sum(r["jfr"].values()) or 1
        for label, count in sorted(r["jfr"].items(), key=lambda kv: -kv[1]):
            if count / jfr_total >= 0.005:
                lines.append(f"  JFR {label:<60} {count:7d} samples {count / jfr_total:6.1%}")
        for frame, count in sorted(r["jfr_store_tops"].items(), key=lambda kv: -kv[1])[:8]:
            lines.append(f"  JFR store frame nearest the top: {frame:<70} {count:6d}")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=sorted(WORKLOAD_TEXT), default="tws")
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--touched-pct", type=float, default=1.0)
    ap.add_argument("--batches", type=int, default=12)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--runs", default="rocksdb-changelog,pss-changelog")
    ap.add_argument("--pyspark", choices=list(BUILT_AGAINST))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    reexec_under_pyspark(args.pyspark)
    code = code_version()
    work = Path(tempfile.mkdtemp(prefix="pss-profile-"))
    input_dir = work / "input"
    write_inputs(input_dir, args.keys, int(args.keys * args.touched_pct / 100), args.batches)
    # The flatmap-sessions workload's Scala function, compiled once against the running Spark.
    jars = {"spark.jars": str(compile_session_buffers(work))} if args.workload == "flatmap-sessions" else {}
    results = []
    with watching_load() as load:
        for name in args.runs.split(","):
            load.phase = name
            results.append(profile(name, args, work, input_dir, jars))
    write_report(report(results, args, code, load), args.out)


if __name__ == "__main__":
    main()
