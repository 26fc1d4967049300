"""README's benchmark figures, generated from the committed outputs in bench/ rather than typed.

Each generated block sits between `<!-- bench_tables: NAME -->` and `<!-- /bench_tables -->` in
README.md or bench/README.md; this script reads the bench/ files each block is made from and writes
the block again. With --check it changes nothing and exits 1 when a block differs from what the
files say (the test command runs it, so a figure typed by hand, or a bench/ file rerun without its
README, fails the tests).

    .venv/bin/python scripts/bench_tables.py            # rewrite the blocks
    .venv/bin/python scripts/bench_tables.py --check    # exit 1 if a block is stale
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
MINORS = ("4.1", "4.2", "4.3")
BASELINES = {  # bench.py's run names -> how README names them
    "rocksdb": "Spark RocksDB",
    "rocksdb-changelog": "Spark RocksDB, changelog",
    "hdfs": "Spark HDFS",
}
BLOCK = re.compile(r"(<!-- bench_tables: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /bench_tables -->)", re.S)


class BenchFileError(Exception):
    """A bench/ file this script cannot read: names the file and what is missing."""


@dataclass
class AggregationRun:
    """One output of scripts/bench.py."""

    path: Path
    date: str
    spark: str
    partitions: int
    repeats: int
    own_jvms: bool  # each query in a JVM of its own (else every provider in one JVM, in a fixed order)
    rows: dict[str, dict[str, str]] = field(default_factory=dict)  # run -> column -> text
    ratios: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)  # (ours, baseline) -> figure -> "0.67x"


def header(path: Path, text: str, pattern: str) -> re.Match[str]:
    match = re.search(pattern, text, re.M)
    if match is None:
        raise BenchFileError(f"{path}: no line matching {pattern!r}; is it the output of the script it is named after?")
    return match


def read_aggregation(path: Path) -> AggregationRun:
    text = path.read_text()
    date = header(path, text, r"^# pystatestore bench, (\S+)")[1]
    machine = header(path, text, r"^# machine: .*Spark (\S+), local\[2\], (\d+) partitions")
    repeats = re.search(r"; (\d+) repeats in rotating order", text)
    own_jvms = "# every query in a JVM of its own" in text
    run = AggregationRun(path, date, machine[1], int(machine[2]), int(repeats[1]) if repeats else 1, own_jvms)
    row = re.compile(
        r"^(?P<run>[\w-]+)\s+(?P<batch>\d+)\s+(?P<commit>[\d.]+)ms\s+(?P<written>[\d.]+) KiB\s+(?P<files>\d+)"
        r"\s+(?P<size>[\d.]+) MiB\s+(?P<restart>\d+)\s+(?P<replayed>\S+)(?:[ \t]+(?P<restored>.+))?$",
        re.M,
    )
    for m in row.finditer(text):
        run.rows[m["run"]] = {k: v for k, v in m.groupdict().items() if v is not None}
    ratio = re.compile(
        r"^[ \t]+(?P<ours>pss-\w+)\s+vs (?P<base>[\w-]+)\s+batch (?P<batch>[\d.]+x)\s+commit p50 (?P<commit>[\d.]+x)"
        r"\s+written/batch (?P<written>[\d.]+x)\s+files (?P<files>[\d.]+x)\s+bytes (?P<bytes>[\d.]+x)"
        r"\s+restart (?P<restart>[\d.]+x)$",
        re.M,
    )
    for m in ratio.finditer(text):
        run.ratios[(m["ours"], m["base"])] = m.groupdict()
    if ("pss-changelog", "rocksdb") not in run.ratios or "pss-changelog" not in run.rows:
        raise BenchFileError(f"{path}: no table or ratios of pss-changelog against rocksdb in it")
    return run


@dataclass
class ScaleRun:
    """One output of scripts/bench_scale.py."""

    path: Path
    date: str
    spark: str
    repeats: int
    rows: dict[str, list[str]]  # provider -> completed, keys, median batch, max batch, peak RSS, restart
    ratios: dict[str, str]  # figure -> "1.20x"
    restored: dict[str, str]  # provider -> where its restart restored from


def read_scale(path: Path) -> ScaleRun:
    text = path.read_text()
    date = header(path, text, r"^# pystatestore scale bench, (\S+)")[1]
    spark = header(path, text, r"^# machine: .*Spark (\S+),")[1]
    repeats = int(header(path, text, r"^# each provider ran (\d+) time")[1])
    rows = {
        m[1]: m[2].split()
        for m in re.finditer(r"^(spark-rocksdb|pss-rocksdb)\s+((?:yes|NO)\s+[\d,]+\s+.*)$", text, re.M)
    }
    line = header(path, text, r"^pss-rocksdb / spark-rocksdb: (.*)$")[1]
    ratios = {m[1]: m[2] for m in re.finditer(r"(peak RSS|median batch|restart batch) ([\d.]+x)", line)}
    restored = {m[1]: m[2] for m in re.finditer(r"^  ([\w-]+) restart restored its state from: (.*)$", text, re.M)}
    if set(rows) != {"spark-rocksdb", "pss-rocksdb"} or len(ratios) < 3:
        raise BenchFileError(f"{path}: expected both providers' rows and three ratios")
    return ScaleRun(path, date, spark, repeats, rows, ratios, restored)


@dataclass
class RestoreRun:
    """One output of scripts/bench_restore.py."""

    path: Path
    date: str
    spark: str
    keys: int
    rows: dict[str, list[str]]
    ratios: dict[str, str]


def read_restore(path: Path) -> RestoreRun:
    text = path.read_text()
    date = header(path, text, r"^# pystatestore restore bench, (\S+)")[1]
    spark = header(path, text, r"^# machine: .*Spark (\S+),")[1]
    keys = int(header(path, text, r"--keys (\d+)")[1])
    rows = {
        m[1]: m[2].split() for m in re.finditer(r"^(spark-rocksdb|pss-local-copy|pss-checkpoint)\s+(.*)$", text, re.M)
    }
    ratios = {m[1]: m[2] for m in re.finditer(r"^(.+): ([\d.]+x)$", text, re.M)}
    if len(rows) != 3:
        raise BenchFileError(f"{path}: expected rows of spark-rocksdb, pss-local-copy and pss-checkpoint")
    return RestoreRun(path, date, spark, keys, rows, ratios)


def rel(path: Path, to: Path) -> str:
    return path.relative_to(to).as_posix() if path.is_relative_to(to) else path.relative_to(ROOT).as_posix()


def aggregation_file(minor: str, partitions: int = 4) -> Path:
    part = "-200-partitions" if partitions == 200 else ""
    return BENCH / f"aggregation-100k-1pct{part}-spark{minor}.txt"


def scale_file(minor: str) -> Path:
    return BENCH / f"scale-8m-keys-1g-heap-spark{minor}.txt"


def method(run: AggregationRun) -> str:
    if run.own_jvms:
        return (
            f"each query in a JVM of its own, {run.repeats} repeats in rotating order (medians); a restart is a new "
            "driver JVM on the same host, where Spark's providers load from the checkpoint"
        )
    return "every provider in one JVM in a fixed order, ours last, restarts in that JVM (an older run)"


def restored_note(run: AggregationRun) -> str:
    where = re.match(
        r"local (\d+) KiB, ckpt (\d+) KiB(?: files \+ (\d+) KiB inside manifests)?(?:, worker (\d+) ms)?",
        run.rows["pss-changelog"].get("restored", ""),
    )
    if where is None:
        return "where ours restored from is not in this file"
    worker = f" in {where[4]} ms of worker time" if where[4] else ""
    if where[3] is None:  # outputs before the inline figure: changes inside manifests went uncounted
        checkpoint = f"{where[2]} KiB of files from the checkpoint (changes read inside its manifests not counted then)"
    else:
        checkpoint = f"{where[2]} KiB of files and {where[3]} KiB of changes inside manifests from the checkpoint"
    return f"ours read {where[1]} KiB from its local copies and {checkpoint}{worker}"


# -- the blocks -------------------------------------------------------------------------------------
def md_table(columns: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


RATIO_COLUMNS = ["batch", "commit", "written", "files", "bytes", "restart"]


def summary_block() -> str:
    """README.md: ours against Spark's RocksDB provider (both commit modes) on 4.3."""
    small, large = read_aggregation(aggregation_file("4.3")), read_aggregation(aggregation_file("4.3", 200))
    scale = read_scale(scale_file("4.3"))
    rows = []
    for label, run in (
        ("aggregation, 100k keys, 1% updated per batch, 4 partitions", small),
        ("the same at Spark's default 200 partitions", large),
    ):
        for i, base in enumerate(("rocksdb", "rocksdb-changelog")):
            r = run.ratios[("pss-changelog", base)]
            figures = [r[k] for k in ("batch", "commit", "written", "bytes", "restart")]
            rows.append([label if i == 0 else "", BASELINES[base], *figures, ""])
    rows.append(
        ["8M keys in a 1 GiB driver heap, 4 partitions", "Spark RocksDB", scale.ratios["median batch"], "", "", ""]
        + [scale.ratios["restart batch"], scale.ratios["peak RSS"]]
    )
    columns = ["workload (Spark 4.3)", "ours vs", "batch time", "commit p50", "written per batch"]
    lines = md_table([*columns, "checkpoint bytes", "restart batch", "peak RSS"], rows)
    lines += [
        "",
        f"Method: {method(small)}"
        + (f"; at 200 partitions: {method(large)}" if method(large) != method(small) else "")
        + f". Restarts: {restored_note(small)} at 4 partitions; {restored_note(large)} at 200. "
        f"From `bench/{rel(small.path, BENCH)}` ({small.date}), `bench/{rel(large.path, BENCH)}` ({large.date}) and "
        f"`bench/{rel(scale.path, BENCH)}` ({scale.date}).",
    ]
    return "\n".join(lines) + "\n"


def aggregation_minors_block() -> str:
    """bench/README.md: ours (changelog) against each built-in provider on every minor, 4 partitions."""
    runs = {minor: read_aggregation(aggregation_file(minor)) for minor in MINORS}
    rows = [
        [label if i == 0 else "", minor, *(run.ratios[("pss-changelog", base)][k] for k in RATIO_COLUMNS)]
        for base, label in BASELINES.items()
        for i, (minor, run) in enumerate(runs.items())
    ]
    columns = ["batch", "commit p50", "written/batch", "ckpt files", "ckpt bytes", "restart"]
    lines = md_table(["ours vs", "Spark", *columns], rows)
    lines.append("")
    for minor, run in runs.items():
        ours, theirs = run.rows["pss-changelog"], run.rows["rocksdb"]
        lines.append(
            f"- {minor} (`{rel(run.path, BENCH)}`, {run.date}, Spark {run.spark}, {method(run)}): commit p50 "
            f"{ours['commit']} ms against Spark RocksDB's {theirs['commit']} ms and its changelog mode's "
            f"{run.rows['rocksdb-changelog']['commit']} ms; restart batch {ours['restart']} ms "
            f"({restored_note(run)}, {ours['replayed']} changelog versions replayed) against "
            f"{theirs['restart']} ms; in snapshot mode ours commits in {run.rows['pss-snapshot']['commit']} ms "
            f"and its checkpoint is {run.ratios[('pss-snapshot', 'rocksdb')]['bytes']} Spark RocksDB's bytes."
        )
    return "\n".join(lines) + "\n"


def aggregation_200_block() -> str:
    """bench/README.md: the same workload at Spark's default 200 partitions, on 4.3."""
    run = read_aggregation(aggregation_file("4.3", 200))
    rows = [
        [label, *(run.ratios[("pss-changelog", base)][k] for k in RATIO_COLUMNS)] for base, label in BASELINES.items()
    ]
    lines = md_table(["ours vs", "batch", "commit p50", "written/batch", "ckpt files", "ckpt bytes", "restart"], rows)
    ours = run.rows["pss-changelog"]
    lines += [
        "",
        f"`{rel(run.path, BENCH)}` ({run.date}, Spark {run.spark}, {method(run)}): "
        f"commit p50 {ours['commit']} ms, "
        f"restart batch {ours['restart']} ms ({restored_note(run)}, {ours['replayed']} changelog versions replayed).",
    ]
    return "\n".join(lines) + "\n"


def scale_block() -> str:
    """bench/README.md: state larger than the heap, every minor."""
    runs = {minor: read_scale(scale_file(minor)) for minor in MINORS}
    rows = []
    for minor, run in runs.items():
        ours, theirs = run.rows["pss-rocksdb"], run.rows["spark-rocksdb"]
        # columns: completed, keys, median batch ms, max batch ms, peak RSS MiB, restart batch ms
        rows.append(
            [
                minor,
                f"{run.ratios['peak RSS']} ({ours[4]} vs {theirs[4]} MiB)",
                f"{run.ratios['median batch']} ({ours[2]} vs {theirs[2]} ms)",
                f"{run.ratios['restart batch']} ({ours[5]} vs {theirs[5]} ms)",
            ]
        )
    lines = md_table(["Spark", "peak RSS (ours vs Spark RocksDB)", "median batch", "restart batch"], rows)
    lines.append("")
    for minor, run in runs.items():
        done = all(row[0] == "yes" for row in run.rows.values())
        where = run.restored.get("pss-rocksdb", "not in this file")
        if where.endswith(" MiB from the checkpoint"):  # outputs before the inline figure
            where += " (files only: changes read inside its manifests not counted then)"
        lines.append(
            f"- {minor}: `{rel(run.path, BENCH)}` ({run.date}, medians of {run.repeats} runs); both completed all "
            f"{run.rows['pss-rocksdb'][1]} keys: {'yes' if done else 'NO'}; ours restored from {where}"
        )
    return "\n".join(lines) + "\n"


def restore_block() -> str:
    """bench/README.md: restoring after a driver restart, local copy vs checkpoint vs Spark RocksDB."""
    run = read_restore(BENCH / "restore-1m-keys.txt")
    rows = run.rows
    lines = [
        f"`{rel(run.path, BENCH)}` ({run.date}, Spark {run.spark}, {run.keys:,} keys, 4 partitions, medians of 3 "
        f"restarts): restart batch {rows['pss-local-copy'][0]} ms from the local copy, {rows['pss-checkpoint'][0]} ms "
        f"from the checkpoint, {rows['spark-rocksdb'][0]} ms Spark RocksDB; worker restore "
        f"{rows['pss-local-copy'][1]} vs {rows['pss-checkpoint'][1]} ms per partition.",
        "",
        *(f"- {name}: {value}" for name, value in run.ratios.items()),
    ]
    return "\n".join(lines) + "\n"


BLOCKS: dict[str, tuple[Path, Callable[[], str]]] = {
    "summary": (ROOT / "README.md", summary_block),
    "aggregation-minors": (BENCH / "README.md", aggregation_minors_block),
    "aggregation-200-partitions": (BENCH / "README.md", aggregation_200_block),
    "scale": (BENCH / "README.md", scale_block),
    "restore": (BENCH / "README.md", restore_block),
}


def render(text: str, doc: Path) -> str:
    """`text` with every block of `doc` generated again; a block this script does not know fails."""

    def replace(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in BLOCKS or BLOCKS[name][0] != doc:
            raise BenchFileError(f"{doc}: unknown generated block {name!r} (known: {', '.join(BLOCKS)})")
        return match[1] + BLOCKS[name][1]() + match[4]

    return BLOCK.sub(replace, text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block is stale")
    args = ap.parse_args()
    stale = 0
    for doc in sorted({doc for doc, _ in BLOCKS.values()}):
        text = doc.read_text()
        missing = [name for name, (d, _) in BLOCKS.items() if d == doc and f"<!-- bench_tables: {name} -->" not in text]
        if missing:
            print(f"bench_tables: {doc.relative_to(ROOT)} lacks the block(s) {', '.join(missing)}", file=sys.stderr)
            stale += 1
            continue
        try:
            new = render(text, doc)
        except BenchFileError as e:
            print(f"bench_tables: {e}", file=sys.stderr)
            return 1
        if new == text:
            continue
        if args.check:
            stale += 1
            print(f"bench_tables: {doc.relative_to(ROOT)} differs from its bench/ files:", file=sys.stderr)
            sys.stderr.writelines(difflib.unified_diff(text.splitlines(True), new.splitlines(True), "README", "bench/"))
        else:
            doc.write_text(new)
            print(f"bench_tables: wrote {doc.relative_to(ROOT)}")
    if stale and args.check:
        print("bench_tables: run .venv/bin/python scripts/bench_tables.py and commit the result", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
