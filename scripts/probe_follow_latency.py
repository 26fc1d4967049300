"""What following a checkpoint costs the service's answers, without the query beside it (issue 68).
The bench's own query (bench_queryable.py: 1M keys, 4 partitions, 10,000 keys updated per batch)
commits --batches batches once; each run then copies that checkpoint with every batch from the
11th on hidden, starts `pystatestore serve` on the copy and the bench's client (3,000 lookups/s
offered over 2 connections, latency from when each lookup was due), and reveals one batch every
1.5 s, as the query committed them. The other CPUs stay idle, so neither the query nor the VM's
stalls (probe_cpu_stalls.py) are in the figures: only the service's own following is. A run with
nothing revealed ("static") is the floor. Reported per run: latency p50/p99/p99.9/max and, for
lookups over 3 ms, where they were due relative to the moment the answers moved to a new batch.

    .venv/bin/python scripts/probe_follow_latency.py [--runs 2] [--seconds 60] [--cpus 1]
        [--checkpoint DIR] [--out FILE]

The output's load line says what else used the machine meanwhile (the service and the client are
this script's children, so theirs does not count): a first output (2026-12-06 20:29, 35.7-42.7 ms
following) had no such line and did not reproduce that evening (4.6-5.8 ms), nor did a replay by
hand disagree with this script when the two ran back to back (decision 0044).
"""

from __future__ import annotations

import argparse
import bisect
import collections
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib.child import run_child, script_argv  # noqa: E402
from benchlib.inputs import write_update_files  # noqa: E402
from benchlib.report import code_version, provenance, watching_load, write_report  # noqa: E402
from benchlib.serving import frozen_copy, pct, service_ready  # noqa: E402

BENCH = Path(__file__).resolve().parent / "bench_queryable.py"
KEYS, TOUCHED, SHOWN = 1_000_000, 10_000, 10  # batches 0-9 committed before the service starts
INTERVAL = 1.5  # the bench's trigger


def build_checkpoint(work: Path, batches: int) -> Path:
    write_update_files(work / "input", KEYS, TOUCHED, batches)
    ckpt = work / "ckpt"
    minutes = batches * INTERVAL / 60 + 0.5  # a batch a file, one every trigger, and the start
    argv = script_argv(
        BENCH, child=True, input=work / "input", checkpoint=ckpt, progress=work / "progress.jsonl", minutes=minutes
    )
    run = run_child(argv, timeout=1800, log=work / "query.log")
    if run.returncode != 0 or not (ckpt / "commits" / str(batches - 1)).exists():
        raise SystemExit(f"the query did not commit {batches} batches; see {work / 'query.log'}")
    return ckpt


def reveal(ckpt: Path, live: Path, batches: int, stop: threading.Event) -> None:
    for n in range(SHOWN, batches):
        if stop.wait(INTERVAL):
            return
        for log in ("offsets", "commits"):  # the offsets first, as Spark writes them
            shutil.copy2(ckpt / log / str(n), live / log / str(n))


def one_run(ckpt: Path, work: Path, batches: int, tag: str, follow: bool, args: argparse.Namespace) -> str:
    live = work / "live"
    frozen_copy(ckpt, live, batches=SHOWN)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pinned = ["taskset", "-c", args.cpus]
    with open(work / f"serve-{tag}.log", "w") as serve_log:
        service = subprocess.Popen(
            [*pinned, sys.executable, "-m", "pystatestore.tools.cli", "serve", str(live), "--port", str(port)],
            stdout=serve_log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.time() + 180
        while not service_ready(port):
            if time.time() > deadline or service.poll() is not None:
                raise SystemExit(f"{tag}: the service did not get ready; see {work / f'serve-{tag}.log'}")
            time.sleep(0.2)
        stop = threading.Event()
        revealer = threading.Thread(target=reveal, args=(ckpt, live, batches, stop), daemon=True)
        if follow:
            revealer.start()
        out = work / f"answers-{tag}.json"
        asker = script_argv(
            BENCH, asker=True, port=port, keys=KEYS, seconds=args.seconds, rate=3000, connections=2, out=out
        )
        subprocess.run([*pinned, sys.executable, *asker], check=True)
        stop.set()
    finally:
        service.terminate()
        service.wait(60)
    return summary(tag, json.loads(out.read_text()))


def summary(tag: str, answers: list[list[float]]) -> str:
    answers.sort()
    ok = [a for a in answers if a[4] == 200]
    ms = [a[1] * 1000 for a in ok]
    line = (
        f"{tag}: {len(ok):,} answered, batches {ok[0][2]}-{ok[-1][2]}; p50 {pct(ms, 0.5):.3f} ms, "
        f"p99 {pct(ms, 0.99):.3f} ms, p99.9 {pct(ms, 0.999):.2f} ms, max {max(ms):.1f} ms"
    )
    first: dict[int, float] = {}
    for due, _, batch, _, _ in ok:
        first.setdefault(int(batch), due)
    swaps = sorted(first.values())[1:]
    if not swaps:
        return line
    near: collections.Counter[int] = collections.Counter()
    for due, latency, *_ in ok:
        if latency > 0.003:
            i = bisect.bisect_left(swaps, due)
            nearest = min((abs(due - swaps[j]), due - swaps[j]) for j in (i - 1, i) if 0 <= j < len(swaps))[1]
            near[max(-3, min(3, int(nearest // 0.1)))] += 1
    slow = sum(near.values())
    spread = ", ".join(f"{k / 10:+.1f}..{(k + 1) / 10:+.1f} s {n}" for k, n in sorted(near.items()))
    return line + f"\n  over 3 ms: {slow:,}, by when due from the nearest move to a new batch: {spread}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=2, help="runs following, and as many static")
    ap.add_argument("--seconds", type=float, default=60, help="the client's time a run")
    ap.add_argument("--cpus", default="1", help="the service and the client on these CPUs (taskset -c)")
    ap.add_argument("--checkpoint", type=Path, help="replay this checkpoint of the bench's query (kept) instead")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    batches = SHOWN + int(args.seconds / INTERVAL) + 5
    work = Path(tempfile.mkdtemp(prefix="pss-probe-follow-"))
    code = code_version()
    if args.checkpoint:
        ckpt = args.checkpoint
        batches = min(batches, len([p for p in (ckpt / "commits").iterdir() if p.name.isdigit()]))
    else:
        ckpt = build_checkpoint(work, batches)
    results = []
    with watching_load() as load:  # what else ran: the figures assume the other CPUs idle
        for i in range(args.runs):
            for follow in (True, False):
                tag = f"{'following' if follow else 'static'}-{i + 1}"
                load.phase = tag
                results.append(one_run(ckpt, work, batches, tag, follow, args))
                print(results[-1], file=sys.stderr, flush=True)
    lines = [
        f"# follow-latency probe, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "# command: .venv/bin/python scripts/" + " ".join([Path(__file__).name, *sys.argv[1:]]),
        *provenance(code, load),
        f"# a checkpoint of {batches} batches of the queryable bench's query, replayed one batch every {INTERVAL} s "
        f"to `pystatestore serve` on CPU {args.cpus} with the client there too, 3,000 lookups/s offered for "
        f"{args.seconds:g} s a run; meant with the other CPUs idle (the load line says whether they were)",
        "",
        *results,
    ]
    write_report("\n".join(lines) + "\n", args.out)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
