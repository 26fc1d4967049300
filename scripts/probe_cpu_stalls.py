"""How long this machine takes a CPU away from a process that never yields it: a spin loop pinned
to one CPU notes every gap between two reads of the clock longer than 1 ms, first with the other
CPUs idle, then with a spin loop on each of them. Nothing of this machine runs in a gap (the loop
would see it as its own time otherwise); a gap is the hypervisor running something else on the
CPU. It bounds what any service on a small VM can promise at p99 (issue 68's queryable bench).

    .venv/bin/python scripts/probe_cpu_stalls.py [--cpu 1] [--seconds 20] [--rounds 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib.report import write_report  # noqa: E402


def spin(cpu: int, seconds: float, gaps: mp.SimpleQueue | None) -> None:  # type: ignore[type-arg]
    os.sched_setaffinity(0, {cpu})
    start = last = time.perf_counter()
    found: list[float] = []
    while last - start < seconds:
        now = time.perf_counter()
        if now - last > 0.001:
            found.append(now - last)
        last = now
    if gaps is not None:
        gaps.put(found)


def probe(cpu: int, seconds: float, others_busy: bool) -> list[float]:
    others = sorted(os.sched_getaffinity(0) - {cpu}) if others_busy else []
    busy = [mp.Process(target=spin, args=(c, seconds + 2, None), daemon=True) for c in others]
    for p in busy:
        p.start()
    time.sleep(1 if busy else 0)  # the other CPUs busy before the probe starts
    gaps: mp.SimpleQueue = mp.SimpleQueue()  # type: ignore[type-arg]
    probe_proc = mp.Process(target=spin, args=(cpu, seconds, gaps))
    probe_proc.start()
    found = gaps.get()
    probe_proc.join()
    for p in busy:
        p.terminate()
        p.join()
    return found


def line(found: list[float], seconds: float) -> str:
    ms = sorted(g * 1000 for g in found)
    return (
        f"gaps over 1 ms {len(ms)}, over 5 ms {sum(g > 5 for g in ms)}, over 10 ms {sum(g > 10 for g in ms)}; "
        f"{sum(ms):.0f} ms lost ({sum(ms) / 10 / seconds:.2f}% of the time), longest {max(ms, default=0):.1f} ms"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", type=int, default=1, help="the CPU probed")
    ap.add_argument("--seconds", type=float, default=20, help="each probe's length")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    lines = [
        f"# CPU stall probe, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "# command: .venv/bin/python scripts/" + " ".join([Path(__file__).name, *sys.argv[1:]]),
        f"# machine: {os.cpu_count()} CPUs; a spin loop on CPU {args.cpu} for {args.seconds:g} s a probe, "
        "counting gaps of over 1 ms between two reads of the clock",
        "",
    ]
    for r in range(args.rounds):
        for others_busy in (False, True):
            found = probe(args.cpu, args.seconds, others_busy)
            what = "the other CPUs busy" if others_busy else "the other CPUs idle"
            lines.append(f"round {r + 1}, {what}: {line(found, args.seconds)}")
    write_report("\n".join(lines) + "\n", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
