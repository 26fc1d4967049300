"""The long form of tests/test_power_cut.py: longer histories of every kind a store writes, each cut
at every event and imaged `lost`, `kept` and `mixed` several times (tests/power_cut.py), every
distinct image restarted and judged (tests/power_cut_history.py). Prints, and with --out writes, the
count of cut points and images per history and every failure.

    .venv/bin/python scripts/power_cut.py [--seeds 3] [--mixed-draws 4] [--out bench/power-cut-spark4.3.txt]
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

from power_cut_history import SHORT, HistorySpec, check_cuts, run_history  # noqa: E402

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
)


def code_version() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    dirty = " (with uncommitted changes)" if git("status", "--porcelain") else ""
    return git("rev-parse", "--short=12", "HEAD") + dirty


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3, help="histories of each kind, each from its own seed")
    ap.add_argument("--mixed-draws", type=int, default=4, help="mixed images per cut point")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    logging.disable(logging.WARNING)  # restores from torn local copies warn, as they should
    started = time.time()
    lines = [
        f"# pystatestore power-cut test, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, code {code_version()}",
        "# command: .venv/bin/python scripts/power_cut.py " + " ".join(sys.argv[1:]),
        "# each history on a recording disk; every event a cut point; each cut imaged lost, kept and "
        f"{args.mixed_draws}x mixed; each distinct image restarted and judged (tests/power_cut_history.py)",
    ]
    print("\n".join(lines), flush=True)
    failures = cuts = images = 0
    with tempfile.TemporaryDirectory(prefix="power-cut-") as tmp:
        for spec in LONG:
            for seed in range(args.seeds):
                run = replace(spec, seed=spec.seed + seed)
                t = time.time()
                recording = run_history(run, Path(tmp) / "disk")
                report = check_cuts(recording, mixed_draws=args.mixed_draws, seed=seed)
                cuts += report.cuts
                images += report.images
                failures += len(report.failures)
                line = (
                    f"{run.name} seed {run.seed}: {len(recording.events)} events, {report.cuts} cuts, "
                    f"{report.images} distinct images, {len(report.failures)} failures ({time.time() - t:.0f} s)"
                )
                lines.append(line)
                print(line, flush=True)
                for failure in report.failures[:20]:
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
