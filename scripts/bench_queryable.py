"""Benchmark: queryable state while the query runs (issue 68). A count per key over 1M keys, 4
partitions, 1% of the keys updated per batch, a batch every 1.5 s (processing-time trigger), on
pystatestore in its default mode. Each run is one query in its own driver JVM for --minutes, of
one of four kinds, taken in turn: the query alone; the query with `pystatestore serve` following
its checkpoint and nobody asking ("following"); the query with the service and a client in
another process asking for random keys (a tenth of them absent) over --connections keep-alive
connections (a thread each) at --rate lookups/s in all ("asked"; --rate 0: as fast as answers come);
and, not by default, the same client asking a service that serves a copy of the checkpoint frozen at
the query's first batch ("frozen": the floor the running query leaves the service, with nothing to
follow).

The client's rate is offered, not answered: each connection sends on a fixed schedule, and a
lookup's latency runs from when it was due, so a stalled service is charged for every lookup that
waited behind it (no coordinated omission).

Reported: the client's latency per lookup (p50, p99, max) and lookups answered per second; the lag
of each answer (how many batches the query had committed, by its progress reports, before the
request that the answer's batch is behind); the query's median batch time of each kind against the
query alone; and, as the anchor, the same question asked through Spark's own state reader
(`spark.read.format("statestore")` with a key filter) on the stopped checkpoint, in the same run.

    .venv/bin/python scripts/bench_queryable.py [--minutes 3] [--repeat 2] [--keys 1000000]
        [--rate 3000] [--connections 2] [--kinds alone,following,asked] [--nice 0]
        [--query-cpus 0 --service-cpus 1] [--pyspark 4.3] [--out bench/queryable-....txt]

--nice -10 runs the service and the client ahead of the query (what a host does by giving the
service a larger CPU weight); it needs root. --query-cpus and --service-cpus split the machine's
cores instead: the query (its driver JVM and everything it starts) on the first set in every kind of
run, the service and the client on the second - a host with a core the query does not use, which is
what a driver host usually has and what this 2-core machine has not.

Goals (issue 68): p50 at most 1 ms and p99 at most 5 ms at the client, at least 3,000 lookups/s,
lag at most 1 batch at p99, the query's batch time with the service at most 1.05x without it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchlib.build import reexec_under_pyspark
from benchlib.child import hidden_options, result_line, run_child, script_argv
from benchlib.inputs import write_update_files
from benchlib.providers import sql_conf
from benchlib.report import code_version, provenance, watching_load, write_report
from benchlib.serving import answered_ms, asker_child, frozen_copy, pct, service_ready

RUN = "pss-changelog"  # benchlib.providers' name of pystatestore's defaults
PARTITIONS = 4
TRIGGER = "1.5 seconds"
WARMUP_BATCHES = 5  # the load of every key, and the first batches after it
ANCHOR_QUESTIONS = 5


# -- the query child --------------------------------------------------------------------------
def query_child(args: argparse.Namespace) -> None:
    if args.cpus:  # before Spark starts: its JVM and the workers under it inherit the set
        os.sched_setaffinity(0, cpu_set(args.cpus))
    from benchlib.session import record_progress, run_count_until, start_session

    spark = start_session("pystatestore-bench-queryable", partitions=PARTITIONS, sql_conf=sql_conf(RUN))
    progress = record_progress(spark, Path(args.progress))
    run_count_until(spark, args.input, args.checkpoint, args.minutes, "bench_queryable", trigger=TRIGGER)
    progress.close()
    spark.stop()


class ServiceWatcher:
    """Started with the query's child: once the query committed its first batch, starts
    `pystatestore serve` on its checkpoint and, when `asking`, the asking client; stops both at the
    end."""

    def __init__(
        self, checkpoint: Path, work: Path, args: argparse.Namespace, tag: str, asking: bool, frozen: bool = False
    ) -> None:
        self.checkpoint, self.work, self.tag, self.asking, self.frozen = checkpoint, work, tag, asking, frozen
        self.keys, self.seconds = args.keys, args.minutes * 60
        self.rate, self.connections = args.rate, args.connections
        self.niced = ["nice", "-n", str(args.nice)] if args.nice else []
        self.niced += ["taskset", "-c", args.service_cpus] if args.service_cpus else []
        self.procs: list[subprocess.Popen] = []
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.answers_file = work / f"answers-{tag}.json"
        self.error: str | None = None

    def start(self) -> None:
        self.started = time.time()
        self.thread.start()

    def _run(self) -> None:
        while not (self.checkpoint / "commits" / "0").exists():
            if self.halt.wait(0.2):
                return
        served = self.checkpoint
        if self.frozen:
            served = self.work / f"frozen-{self.tag}"
            frozen_copy(self.checkpoint, served, batches=1)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        serve_log = open(self.work / f"serve-{self.tag}.log", "w")  # noqa: SIM115 - closed with the process
        self.procs.append(
            subprocess.Popen(
                [*self.niced, sys.executable, "-m", "pystatestore.tools.cli", "serve", str(served)]
                + ["--port", str(port)],
                stdout=serve_log,
                stderr=subprocess.STDOUT,
            )
        )
        deadline = time.time() + 60
        while not self.halt.is_set():
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.time() > deadline:
                    self.error = "the service did not start; see its log"
                    return
                time.sleep(0.2)
        if not self.asking:
            return
        # Lookups start once the service is ready (every store open), as a load balancer's
        # readiness check would send them: the first restores are the service's start, not its answers.
        while not self.halt.is_set() and not service_ready(port):
            if time.time() > deadline + 120:
                self.error = "the service did not open every store in 3 minutes; see its log"
                return
            time.sleep(0.2)
        left = self.seconds - (time.time() - self.started) - 5  # ends before the query does
        argv = script_argv(
            __file__,
            asker=True,
            port=port,
            keys=self.keys,
            seconds=left,
            rate=self.rate,
            connections=self.connections,
            out=self.answers_file,
        )
        self.procs.append(subprocess.Popen([*self.niced, sys.executable, *argv]))

    def stop(self) -> None:
        self.halt.set()
        self.thread.join(30)
        for proc in reversed(self.procs):
            if proc.poll() is None and proc is self.procs[0]:
                proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()


# -- the anchor: Spark's own state reader -------------------------------------------------------
def anchor_child(args: argparse.Namespace) -> None:
    from pyspark.sql import functions as F

    from benchlib.session import start_session

    spark = start_session("pystatestore-bench-queryable-anchor", partitions=PARTITIONS, sql_conf=sql_conf(RUN))
    rnd = random.Random(3)
    seconds = []
    for _ in range(ANCHOR_QUESTIONS):
        key = rnd.randrange(args.keys)
        started = time.perf_counter()
        rows = spark.read.format("statestore").load(args.checkpoint).filter(F.col("key.key") == key).collect()
        seconds.append(time.perf_counter() - started)
        if len(rows) != 1:
            raise SystemExit(f"Spark's state reader found {len(rows)} rows for key {key}")
    print("RESULT " + json.dumps(seconds), flush=True)
    spark.stop()


# -- the parent ---------------------------------------------------------------------------------
KINDS = {
    "alone": "the query alone",
    "following": "the service following",
    "asked": "the service asked",
    "frozen": "the service asked, serving a copy frozen at the first batch",
}
ASKED_KINDS = ("asked", "frozen")


def run_query(args: argparse.Namespace, work: Path, tag: str, kind: str) -> dict[str, Any]:
    checkpoint, progress = work / f"ckpt-{tag}", work / f"progress-{tag}.jsonl"
    cmd = script_argv(
        __file__,
        child=True,
        input=work / "input",
        checkpoint=checkpoint,
        progress=progress,
        minutes=args.minutes,
        cpus=args.query_cpus,
    )
    print(f"bench_queryable: {tag} ({KINDS[kind]})", file=sys.stderr, flush=True)
    log = work / f"{tag}.log"
    watcher = ServiceWatcher(checkpoint, work, args, tag, asking=kind in ASKED_KINDS, frozen=kind == "frozen")
    run = run_child(
        cmd, timeout=args.minutes * 60 + 600, log=log, watch=lambda pid: [watcher] if kind != "alone" else []
    )
    if run.returncode != 0:
        raise SystemExit(f"{tag}: exit code {run.returncode}; log tail:\n{log.read_text()[-3000:]}")
    if watcher.error:
        raise SystemExit(f"{tag}: {watcher.error} ({work})")
    batches = [json.loads(line) for line in progress.read_text().splitlines() if line.strip()]
    batches = [b for b in batches if b.get("numInputRows", 0) > 0]
    result: dict[str, Any] = {"batches": batches, "checkpoint": checkpoint}
    if kind in ASKED_KINDS:
        result["answers"] = json.loads(watcher.answers_file.read_text()) if watcher.answers_file.exists() else []
    return result


def committed_at(batches: list[dict[str, Any]]) -> list[tuple[float, int]]:
    """(wall time, batch id) of each batch's end: its trigger's start plus its duration."""
    out = []
    for b in batches:
        start = dt.datetime.fromisoformat(b["timestamp"].replace("Z", "+00:00")).timestamp()
        out.append((start + b["durationMs"]["triggerExecution"] / 1000, b["batchId"]))
    return sorted(out)


def lags(answers: list[list[Any]], batches: list[dict[str, Any]]) -> list[int]:
    """Per answer: the newest batch committed before its request started, less the answer's batch."""
    ends = committed_at(batches)
    out = []
    for started, _, batch, _, status in answers:
        if status != 200:
            continue
        newest = max((b for t, b in ends if t <= started), default=batch)
        out.append(max(0, newest - batch))
    return out


def cpu_set(spec: str) -> set[int]:
    """CPUs as taskset -c takes them: "0", "0,2" or "0-3"."""
    cpus: set[int] = set()
    for part in spec.split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=3.0, help="how long each run's query runs")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each kind, alternating")
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--touched-pct", type=float, default=1.0)
    ap.add_argument("--rate", type=float, default=3000.0, help="lookups/s offered in all (0: as fast as answered)")
    ap.add_argument("--connections", type=int, default=2, help="the client's keep-alive connections, a thread each")
    ap.add_argument(
        "--nice",
        type=int,
        default=0,
        help="run the service and the client at this niceness (negative: ahead of the query; needs root)",
    )
    ap.add_argument("--query-cpus", help="run the query (JVM and workers) on these CPUs only, e.g. 0")
    ap.add_argument("--service-cpus", help="run the service and the client on these CPUs only, e.g. 1")
    ap.add_argument("--kinds", default="alone,following,asked", help="the kinds of run, taken in turn")
    ap.add_argument("--pyspark", help="the Spark minor to run (default: the venv's)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--asker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--anchor", action="store_true", help=argparse.SUPPRESS)
    hidden_options(ap, "--input", "--checkpoint", "--progress", "--port", "--seconds", "--cpus")
    args = ap.parse_args()
    kinds = args.kinds.split(",")
    for given in (args.query_cpus, args.service_cpus):
        if given and not args.child and not cpu_set(given) <= os.sched_getaffinity(0):
            ap.error(f"--query-cpus/--service-cpus: {given} is not among this machine's CPUs")
    if bool(args.query_cpus) != bool(args.service_cpus) or (
        args.query_cpus and cpu_set(args.query_cpus) & cpu_set(args.service_cpus)
    ):
        ap.error("--query-cpus and --service-cpus go together and share no CPU")
    if not args.child and not args.asker and not args.anchor and ("alone" not in kinds or set(kinds) - set(KINDS)):
        ap.error(f"--kinds: some of {', '.join(KINDS)}, alone among them (every ratio is against it)")
    if args.child:
        query_child(args)
        return 0
    if args.asker:
        asker_child(args)
        return 0
    if args.anchor:
        anchor_child(args)
        return 0
    reexec_under_pyspark(args.pyspark)
    import pyspark

    code = code_version()
    work = Path(tempfile.mkdtemp(prefix="pss-bench-queryable-"))
    touched = max(1, int(args.keys * args.touched_pct / 100))
    write_update_files(work / "input", args.keys, touched, int(args.minutes * 60 / 1.0) + 10)
    runs: list[tuple[str, dict[str, Any]]] = []
    with watching_load() as load:
        for i in range(args.repeat):
            for kind in kinds if i % 2 == 0 else kinds[::-1]:
                tag = f"{kind}-{i + 1}"
                load.phase = tag
                runs.append((tag, run_query(args, work, tag, kind)))
        load.phase = "anchor"
        served = [r for tag, r in runs if not tag.startswith("alone")] or [r for _, r in runs]
        anchor = run_child(
            script_argv(__file__, anchor=True, checkpoint=served[-1]["checkpoint"], keys=args.keys),
            timeout=1800,
        )
        anchor_line = result_line(anchor.stdout)
        if anchor.returncode != 0 or anchor_line is None:
            raise SystemExit(f"the anchor failed: {anchor.stderr[-3000:]}")
        anchor_s = json.loads(anchor_line)

    def steady_ms(run: dict[str, Any]) -> list[float]:
        return [b["durationMs"]["triggerExecution"] for b in run["batches"][WARMUP_BATCHES:]]

    def medians(kind: str) -> list[float]:
        return [statistics.median(steady_ms(r)) for tag, r in runs if tag.rsplit("-", 1)[0] == kind]

    alone = medians("alone")
    asked_runs = [r for tag, r in runs if tag.startswith("asked")]
    answers = [a for r in asked_runs for a in r["answers"]]
    latencies_ms = answered_ms(answers)
    # the client asks from the service's readiness (every store open) until just before the query ends
    seconds = sum(r["answers"][-1][0] - r["answers"][0][0] for r in asked_runs if r["answers"])
    all_lags = [lag for r in asked_runs for lag in lags(r["answers"], r["batches"])]
    failed = len(answers) - len(latencies_ms)
    offered = "as fast as answers come" if not args.rate else f"{args.rate:,.0f} lookups/s offered in all"
    lines = [
        f"# pystatestore queryable-state bench, {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
        "# command: .venv/bin/python scripts/" + " ".join([Path(__file__).name, *sys.argv[1:]]),
        *provenance(code, load),
        f"# machine: {platform.machine()}, {os.cpu_count()} cores, Spark {pyspark.__version__}, local[2], "
        f"{PARTITIONS} partitions, trigger every {TRIGGER}",
        f"# workload: a count and sum per key, {args.keys:,} keys loaded by the first batch, then {touched:,} "
        f"random keys updated per batch; each run a query of {args.minutes:g} min in its own driver JVM, "
        f"{args.repeat} run(s) of each kind ({', '.join(f'{k}: {KINDS[k]}' for k in kinds)}), taken in turn",
        "# the service: `pystatestore serve CHECKPOINT` (another process) following the commit log; the client: "
        "another process asking GET /v1/state for random keys (a tenth never written) over "
        f"{args.connections} keep-alive connection(s), {offered}, latency counted from when each lookup was due"
        + (f"; the service and the client at niceness {args.nice} (the query at 0)" if args.nice else "")
        + (
            f"; the query (its JVM and workers) on CPU {args.query_cpus} in every run, the service and the "
            f"client on CPU {args.service_cpus}: a host with a core the query does not use"
            if args.query_cpus
            else ""
        ),
        "",
    ]
    if answers:
        lines += [
            f"lookups: {len(latencies_ms):,} answered in {seconds:.0f} s ({len(latencies_ms) / seconds:,.0f}/s), "
            f"{failed} failed",
            f"latency at the client: p50 {pct(latencies_ms, 0.5):.3f} ms, p99 {pct(latencies_ms, 0.99):.3f} ms, "
            f"max {max(latencies_ms):.1f} ms",
        ]
        if len(asked_runs) > 1:  # runs of one kind vary here: each run's own p99 shows how much
            lines.append(
                "latency p99 by run: "
                + ", ".join(
                    f"{tag} {pct(answered_ms(r['answers']), 0.99):.3f} ms" for tag, r in runs if tag.startswith("asked")
                )
            )
        lines += [
            f"lag behind the commit log (batches): p50 {pct(all_lags, 0.5)}, p99 {pct(all_lags, 0.99)}, "
            f"max {max(all_lags)}",
        ]
    frozen_runs = [(tag, r) for tag, r in runs if tag.startswith("frozen") and r["answers"]]
    if frozen_runs:
        frozen_ms = [ms for _, r in frozen_runs for ms in answered_ms(r["answers"])]
        lines.append(
            f"latency at the client, serving a frozen copy (nothing to follow): p50 {pct(frozen_ms, 0.5):.3f} ms, "
            f"p99 {pct(frozen_ms, 0.99):.3f} ms, max {max(frozen_ms):.1f} ms; p99 by run: "
            + ", ".join(f"{tag} {pct(answered_ms(r['answers']), 0.99):.3f} ms" for tag, r in frozen_runs)
        )
    lines.append(
        f"query median batch ms (batches after the first {WARMUP_BATCHES}): "
        + "; ".join(f"{KINDS[k]} {', '.join(f'{v:.0f}' for v in medians(k))}" for k in kinds)
    )
    for kind in kinds:
        if kind != "alone":
            ratio = statistics.median(medians(kind)) / statistics.median(alone)
            lines.append(f"query batch time, {KINDS[kind]} / alone: {ratio:.3f}x")
    anchor_ms = statistics.median(anchor_s) * 1000
    lines.append(
        f"anchor: spark.read.format('statestore') with a key filter, on the stopped checkpoint: "
        f"median {anchor_ms:,.0f} ms a question ({ANCHOR_QUESTIONS} questions)"
        + (f"; the service's p50 is {anchor_ms / pct(latencies_ms, 0.5):,.0f}x faster" if answers else "")
    )
    write_report("\n".join(lines) + "\n", args.out)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
