"""The long form of tests/test_power_cut.py: longer histories of every kind a store writes, each cut
at every event and imaged `lost`, `kept`, and `mixed` and `subset` several times each
(tests/power_cut.py), plus every order of garbage collection's unsynced manifest removals; every
distinct image restarted and judged (tests/power_cut_history.py), every other one with Spark's
commit log a batch behind. Then `--restarts` cuts of each history have their restart recorded and
cut at every event (a power cut during the recovery from one). Prints, and with --out writes, the
count of cut points and images per history and every failure.

    .venv/bin/python scripts/power_cut.py [--seeds 3] [--mixed-draws 4] [--restarts 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "tests")]

from power_cut import KINDS  # noqa: E402
from power_cut_history import SCRATCH, SHORT, HistorySpec, check_cuts, check_restart_cuts, run_history  # noqa: E402

LONG = (
    *SHORT,
    HistorySpec(
        "changelog-durable-first-long",
        "changelog",
        True,
        ("big", "commit", "snapshot", "commit", "big", "gc", "commit", "snapshot", "big", "commit", "gc", "big"),
    ),
    HistorySpec(
        "changelog-applied-first-sst-snapshots",
        "changelog",
        False,
        ("commit", "big", "snapshot", "big", "commit", "gc", "big", "snapshot", "commit", "gc"),
        options=(("compactSnapshotMaxBytes", "0"),),
    ),
    HistorySpec(
        "snapshot-commits-long",
        "snapshot",
        False,
        ("commit", "big", "commit", "big", "commit", "gc", "big", "commit", "gc", "big"),
        options=(("compactSnapshotMaxBytes", "0"),),
    ),
    HistorySpec(
        "changelog-checkpoint-ids-long",
        "changelog",
        True,
        ("whole", "commit", "big", "commit", "snapshot", "big", "commit", "gc", "whole", "commit", "big", "gc"),
        checkpoint_ids=True,
    ),
    HistorySpec(
        "snapshot-commits-checkpoint-ids",
        "snapshot",
        False,
        ("commit", "big", "whole", "commit", "gc", "big", "commit", "gc"),
        checkpoint_ids=True,
    ),
)


def code_version() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    dirty = " (with uncommitted changes)" if git("status", "--porcelain") else ""
    return git("rev-parse", "--short=12", "HEAD") + dirty


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3, help="histories of each kind, each from its own seed")
    ap.add_argument("--mixed-draws", type=int, default=4, help="mixed and subset images per cut point (each)")
    ap.add_argument("--restarts", type=int, default=3, help="cuts per history whose restart is cut at every event")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    logging.disable(logging.WARNING)  # restores from torn local copies warn, as they should
    started = time.time()
    lines = [
        f"# pystatestore power-cut test, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, code {code_version()}",
        "# command: .venv/bin/python scripts/power_cut.py " + " ".join(sys.argv[1:]),
        "# each history on a recording disk, in a checkpoint whose directories Spark made unsynced; every event a "
        f"cut point; each cut imaged lost, kept, {args.mixed_draws}x mixed, {args.mixed_draws}x subset and every "
        "order of unsynced manifest removals; each distinct image restarted and judged, every other one with "
        f"Spark's commit log a batch behind (tests/power_cut_history.py); then {args.restarts} restarts per "
        "history cut at every event (lost and subset)",
    ]
    print("\n".join(lines), flush=True)
    failures = cuts = images = 0
    with tempfile.TemporaryDirectory(prefix="power-cut-", dir=SCRATCH) as tmp:
        for spec in LONG:
            for seed in range(args.seeds):
                run = replace(spec, seed=spec.seed + seed)
                t = time.time()
                recording = run_history(run, Path(tmp) / "disk")
                report = check_cuts(recording, kinds=KINDS, mixed_draws=args.mixed_draws, seed=seed)
                restarts = check_restart_cuts(recording, first_cuts=args.restarts, mixed_draws=1, seed=seed)
                cuts += report.cuts + restarts.cuts
                images += report.images + restarts.images
                failures += len(report.failures) + len(restarts.failures)
                line = (
                    f"{run.name} seed {run.seed}: {len(recording.events)} events, {report.cuts} cuts, "
                    f"{report.images} distinct images; {args.restarts} restarts cut {restarts.cuts} times, "
                    f"{restarts.images} distinct images; {len(report.failures) + len(restarts.failures)} failures "
                    f"({time.time() - t:.0f} s)"
                )
                lines.append(line)
                print(line, flush=True)
                for failure in (report.failures + restarts.failures)[:20]:
                    lines.append(f"  {failure}")
                    print(f"  {failure}", flush=True)
    total = (
        f"power cut: {cuts} cuts, {images} distinct images, {failures} failures "
        f"in {(time.time() - started) / 60:.0f} min"
    )
    lines.append(total)
    print(total)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
