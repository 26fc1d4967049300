"""What every benchmark output says besides its figures: which code made it (the commit, whether
the tree held changes, where pystatestore was imported from) and how loaded the machine was while
it ran. The commands and machines are each benchmark's own header lines."""

from __future__ import annotations

import importlib.util
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from benchlib import ROOT
from benchlib.samplers import LoadMonitor


def code_version() -> str:
    """'commit <sha>, clean tree' or '..., tree changed (N files outside bench/)', and where the
    pystatestore package comes from (a checkout's python/ or an installed wheel)."""
    try:
        sha = _git("rev-parse", "--short=12", "HEAD").strip()
        # bench/ holds the outputs: a rerun that rewrites one there is not a change of code
        changed = _git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)bench").splitlines()
        tree = f"tree changed ({len(changed)} files outside bench/)" if changed else "clean tree"
        where = f"commit {sha}, {tree}"
    except (OSError, subprocess.CalledProcessError):
        where = "not a git checkout"
    spec = importlib.util.find_spec("pystatestore")
    package = Path(spec.origin).parent if spec is not None and spec.origin else "not importable"
    return f"{where}; pystatestore from {package}"


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout


@contextmanager
def watching_load() -> Iterator[LoadMonitor]:
    """The machine's load sampled while the block runs; `summary()` says it in one line after."""
    monitor = LoadMonitor()
    monitor.start()
    try:
        yield monitor
    finally:
        monitor.stop()


def provenance(code: str, load: LoadMonitor, prefix: str = "# ") -> list[str]:
    """The header lines naming the code that ran and the machine's load meanwhile."""
    return [f"{prefix}code: {code}", f"{prefix}load: {load.summary()}"]


def write_report(text: str, out: Path | None) -> None:
    """Prints the report, and writes it to `out` too when given."""
    print(text, end="" if text.endswith("\n") else "\n")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
