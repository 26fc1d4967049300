"""Benchmark: one point read in the JVM through Spark's rocksdbjni, `get` alone against
`keyMayExist` first (what pystatestore's read views do, decision 0035), for missing and present keys,
against a store of 1 to N sorted runs (decision 0039).

rocksdbjni's `get` reports a missing key by throwing and catching a C++ exception inside the native
call; a growing state's new keys are all misses. Each commit ingests its changes as one sorted run,
and a read looks in every run until it finds the key (a miss looks in all of them, Bloom filter
first), so a read's cost grows with the runs a view holds between compactions.
`scripts/jvm/PointReadBench.java` runs in a JVM of its own per Spark minor (its rocksdbjni jar on the
classpath), writes a DB of `--keys` keys as the worker writes a store (one ingested SST per run, Bloom
filters, partitioned index and filters), opens it read-only with the views' reader options and times
each kind of read over every key in a random order, `--rounds` times per run count; reported:
medians per read and ratios.

    .venv/bin/python scripts/bench_point_reads.py [--keys 1000000] [--rounds 5] [--runs 1,4,8]
        [--pyspark 4.1,4.2,4.3] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime as dt
import glob
import platform
import statistics
import subprocess
import sys
from pathlib import Path

from benchlib import SCRIPTS
from benchlib.build import build_jar
from benchlib.report import code_version, provenance, watching_load, write_report

SOURCE = SCRIPTS / "jvm" / "PointReadBench.java"
CASES = ("miss_get", "miss_maybe", "hit_get", "hit_maybe")


def run_minor(minor: str, keys: int, rounds: int, runs: str) -> tuple[str, dict[int, dict[str, float]]]:
    """(rocksdbjni jar name, {runs: median microseconds per read of each case}) on `minor`'s rocksdbjni."""
    jar = sorted(glob.glob(str(build_jar().spark_jars_dir(minor) / "rocksdbjni-*.jar")))[-1]
    out = subprocess.run(
        ["java", "-cp", jar, str(SOURCE), str(keys), str(rounds), runs], check=True, capture_output=True, text=True
    ).stdout
    rows = [dict(f.split("=") for f in line.split()[1:]) for line in out.splitlines() if line.startswith("ROUND")]
    medians: dict[int, dict[str, float]] = {}
    for count in sorted({int(r["runs"]) for r in rows}):
        mine = [r for r in rows if int(r["runs"]) == count]
        medians[count] = {c: statistics.median(float(r[c]) for r in mine) for c in CASES}
    return Path(jar).name, medians


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", default="1,4,8", help="comma-separated sorted-run counts of the DB read")
    ap.add_argument("--pyspark", default="4.1,4.2,4.3")
    ap.add_argument("--out")
    args = ap.parse_args()
    code = code_version()
    results = []
    with watching_load() as load:
        for minor in args.pyspark.split(","):
            load.phase = minor
            results.append((minor, *run_minor(minor, args.keys, args.rounds, args.runs)))
    code_line, load_line = provenance(code, load)
    lines = [
        f"# pystatestore point-read bench, {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"# command: {' '.join([Path(sys.executable).name, *sys.argv])}",
        code_line,
        f"# machine: {platform.machine()}, one JVM per Spark minor; {args.keys:,} keys of 10 bytes, values of 12"
        " bytes, written as the worker writes a store (one ingested SST per sorted run, Bloom filters,"
        " partitioned index and filters) and read in a random order with the read views' reader options;"
        f" medians of {args.rounds} rounds, µs per read",
        load_line,
        "",
        "spark  rocksdbjni             runs  miss: get  keyMayExist first   hit: get  keyMayExist first"
        "   miss ratio  hit ratio",
    ]
    for minor, jar, by_runs in results:
        for runs, m in by_runs.items():
            lines.append(
                f"{minor:<6} {jar:<22} {runs:>4} {m['miss_get']:>10.2f}  {m['miss_maybe']:>17.2f}  {m['hit_get']:>9.2f}"
                f"  {m['hit_maybe']:>17.2f}  {m['miss_maybe'] / m['miss_get']:>9.2f}x"
                f"  {m['hit_maybe'] / m['hit_get']:>8.2f}x"
            )
    lines.append("")
    lines.append("(ratio: keyMayExist first / get alone; < 1 means the views' way is faster)")
    write_report("\n".join(lines) + "\n", Path(args.out) if args.out else None)


if __name__ == "__main__":
    main()
