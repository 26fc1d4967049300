"""The report of a run directory: per module and provider, passed / failed / errors / skipped and
the run time, the checkpoints each run left, and each failure with its test name and the first line
of its error, sorted into failures on pystatestore only, on both, and on RocksDB only."""

from __future__ import annotations

import json
import re
from pathlib import Path

from suiteslib.record import PY4J_WRAPPER, cause_in_text, innermost_in_text
from suiteslib.sources import RELEASE

PROVIDERS = {"ours": "pystatestore", "rocksdb": "Spark RocksDB"}


def counts(records: list[dict]) -> dict[str, int]:
    c = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    for r in records:
        c[r["status"]] = c.get(r["status"], 0) + 1
    c["total"] = sum(c.values())
    return c


def failed(records: list[dict]) -> dict[str, dict]:
    return {r["test"]: r for r in records if r["status"] in ("failed", "error")}


def short(line: str) -> str:
    """A first line without the query's id and run id (they differ in every run)."""
    return re.sub(r"Query \[id = [0-9a-f-]+, runId = [0-9a-f-]+\] ", "Query ", line)


def describe(r: dict, indent: str) -> list[str]:
    """A failure's lines: its first line, where a Python traceback in it ends, its JVM cause."""
    lines = [f"{indent}{r['test']} [{r['status']}]: {short(r.get('first_line', ''))[:400]}"]
    text = r.get("traceback", "")
    inner = innermost_in_text(text) or r.get("innermost", "")
    if inner and inner not in r.get("first_line", ""):
        lines.append(f"{indent}  innermost: {inner[:400]}")
    cause = r.get("cause") or cause_in_text(text)
    if cause.startswith(PY4J_WRAPPER):
        cause = ""
    if cause:
        lines.append(f"{indent}  cause: {cause[:400]}")
    return lines


def render(work: Path, meta: dict) -> str:
    runs = [json.loads(p.read_text()) for p in sorted(work.glob("*.json")) if p.name != "meta.json"]
    by_module: dict[str, dict[str, dict]] = {}
    for run in runs:
        by_module.setdefault(run["module"], {})[run["provider"]] = run
    out = [
        f"PySpark {RELEASE}'s transformWithState test suites: pystatestore vs Spark's RocksDB provider",
        f"date: {meta['date']}  machine: {meta['machine']}",
        f"command: {meta['command']}",
        *([f"code: {meta['code']}"] if "code" in meta else []),  # runs before 2026-12-05 kept none
        f"pyspark: {meta['pyspark']} (the released wheel, {meta['pyspark_dir']})",
        f"pystatestore: {meta['pystatestore']}; shim jar {meta['jar']} sha256 {meta['jar_sha256'][:16]}",
        "test sources: " + meta["tests_origin"].replace("\n", "\n  "),
        f"modules run: {', '.join(meta['modules']) or '(none)'}",
    ]
    if meta.get("only"):
        out.append(f"only the tests whose names hold: {meta['only']}")
    if meta.get("left_out"):
        out.append("left out: " + "; ".join(meta["left_out"]))
    out += [
        "ours = the suites' classes subclassed with conf() passed through pystatestore.configure_spark "
        "(providerClass, spark.jars, pythonExec, pythonPath); rocksdb = the suites unchanged.",
        "",
    ]
    total_s = 0
    for module, pair in by_module.items():
        out.append(f"== {module}")
        out.append(f"  {'provider':<14}{'passed':>7}{'failed':>7}{'errors':>7}{'skipped':>8}{'total':>7}{'time':>9}")
        for provider in ("ours", "rocksdb"):
            run = pair.get(provider)
            if run is None:
                continue
            c = counts(run["records"])
            total_s += run["seconds"]
            flag = " (timed out)" if run["timed_out"] else "" if run["rc"] == 0 else f" (exit {run['rc']})"
            out.append(f"  {PROVIDERS[provider]:<14}{c['passed']:>7}{c['failed']:>7}{c['error']:>7}{c['skipped']:>8}"
                       f"{c['total']:>7}{run['seconds'] / 60:>7.1f} m{flag}")  # fmt: skip
        for provider, run in pair.items():
            cps: dict[str, str] = {}
            for r in run["records"]:
                cps.update(r.get("checkpoints", {}))
            kinds = {k: sum(1 for v in cps.values() if v == k) for k in ("pystatestore", "rocksdb", "both", "none")}
            desc = ", ".join(f"{n} {k}" for k, n in kinds.items() if n) or "none left on disk"
            all_ours = provider != "ours" or kinds["rocksdb"] == kinds["both"] == 0
            ok = "" if all_ours else "  <-- NOT ALL ON PYSTATESTORE"
            out.append(f"  checkpoints the {PROVIDERS[provider]} run left: {len(cps)} ({desc}){ok}")
        ours_f = failed(pair["ours"]["records"]) if "ours" in pair else {}
        rocks_f = failed(pair["rocksdb"]["records"]) if "rocksdb" in pair else {}
        groups = [
            ("failures on pystatestore only", {t: r for t, r in ours_f.items() if t not in rocks_f}),
            ("failures on both providers (pystatestore's error)", {t: r for t, r in ours_f.items() if t in rocks_f}),
            ("failures on Spark's RocksDB only", {t: r for t, r in rocks_f.items() if t not in ours_f}),
        ]
        for title, items in groups:
            if "rocksdb" not in pair and title != groups[0][0]:
                continue
            out.append(f"  {title}: {len(items)}")
            for test, r in sorted(items.items()):
                out += describe(r, "    ")
                if test in ours_f and test in rocks_f:
                    out += [ln.replace(f"{test} ", "on RocksDB: ", 1) for ln in describe(rocks_f[test], "      ")]
        out.append("")
    for note in meta.get("notes", []):
        out.append(f"note: {note}")
    out.append(f"total run time: {total_s / 60:.1f} minutes")
    out.append(f"tracebacks: {work}/<module>-<provider>.json (records[].traceback) and .log")
    return "\n".join(out) + "\n"
