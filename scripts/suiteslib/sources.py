"""Where PySpark's transformWithState test modules come from: the released sdist (checked for
tests), a Spark source tree, or the cached test directory; which modules they need; the overlay of
the released wheel's pyspark package they run from; and the snapshot of pystatestore they run."""

from __future__ import annotations

import ast
import importlib.util
import json
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterable
from pathlib import Path

from benchlib import ROOT
from benchlib.build import build_jar

RELEASE = "4.1.4"
MINOR = "4.1"
TESTS_PREFIX = "pyspark/sql/tests/"
NAME_PARTS = ("transform_with_state", "tws", "state_data_source", "ttl")


def sdist_archive() -> Path:
    """pyspark-<RELEASE>.tar.gz from PyPI, downloaded once per machine."""
    target = build_jar().cache_dir() / "pyspark-sdist"
    archive = target / f"pyspark-{RELEASE}.tar.gz"
    if archive.is_file():
        return archive
    target.mkdir(parents=True, exist_ok=True)
    print(f"pyspark_suites: downloading the pyspark {RELEASE} sdist (~450 MB) into {target}", file=sys.stderr)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-binary", ":all:",
           "--no-deps", f"pyspark=={RELEASE}", "-d", str(target)]  # fmt: skip
    if subprocess.run(cmd).returncode != 0 or not archive.is_file():
        raise SystemExit(f"could not download the pyspark {RELEASE} sdist (command: {' '.join(cmd)})")
    return archive


def sdist_test_members(archive: Path) -> list[str]:
    """The archive's members under pyspark/sql/tests/ (cached beside it: listing takes a while)."""
    listing = archive.with_name(archive.name + ".tests.json")
    if listing.is_file() and listing.stat().st_mtime >= archive.stat().st_mtime:
        return list(json.loads(listing.read_text()))
    with tarfile.open(archive) as tar:
        members = [m.name for m in tar.getmembers() if m.isfile() and f"/{TESTS_PREFIX}" in m.name]
    listing.write_text(json.dumps(members))
    return members


def tests_source(tests_from: str | None) -> tuple[Path, str]:
    """A directory holding pyspark/sql/tests/..., and where its files came from."""
    if tests_from:
        for cand in (Path(tests_from), Path(tests_from) / "python"):
            if (cand / TESTS_PREFIX).is_dir():
                return cand.resolve(), f"--tests-from {cand.resolve()}"
        raise SystemExit(f"--tests-from {tests_from}: no {TESTS_PREFIX} there or under python/")
    archive = sdist_archive()
    members = sdist_test_members(archive)
    if members:
        dest = build_jar().cache_dir() / f"pyspark-{RELEASE}-sdist-tests"
        if not (dest / TESTS_PREFIX).is_dir():
            with tarfile.open(archive) as tar:
                for m in tar.getmembers():
                    if m.name in members:
                        m.name = m.name.split("/", 1)[1]  # strip pyspark-<RELEASE>/
                        tar.extract(m, dest)
        return dest, f"the PyPI sdist {archive.name}"
    note = f"the PyPI sdist {archive.name} holds no {TESTS_PREFIX} (checked {archive})"
    cached = build_jar().cache_dir() / f"pyspark-{RELEASE}-tests"
    if (cached / TESTS_PREFIX).is_dir():
        source_txt = cached / "SOURCE.txt"
        origin = source_txt.read_text().strip() if source_txt.is_file() else "(no SOURCE.txt)"
        return cached, f"{note}; used {cached}:\n{origin}"
    raise SystemExit(
        f"pyspark_suites: {note}, and {cached} does not exist. Give the tests with --tests-from: a Spark "
        f"source tree of the v{RELEASE} tag (git clone --branch v{RELEASE} of apache/spark), or its python/ dir."
    )


def is_suite(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return name.startswith("test_") and name.endswith(".py") and any(p in name for p in NAME_PARTS)


def discover(source: Path) -> tuple[list[str], list[str]]:
    """(modules to run, modules left out as Spark Connect parity suites), as dotted names."""
    run, connect = [], []
    for path in sorted((source / TESTS_PREFIX).rglob("test_*.py")):
        rel = path.relative_to(source).as_posix()
        if not is_suite(rel):
            continue
        (connect if "/connect/" in rel else run).append(rel[:-3].replace("/", "."))
    return run, connect


def module_file(source: Path, dotted: str) -> Path | None:
    base = source / dotted.replace(".", "/")
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.is_file():
            return cand
    return None


def imported_modules(path: Path) -> set[str]:
    """Every module (and, for `from X import Y`, also X.Y) a file imports, absolute names only."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names if a.name != "*")
    return found


def closure(source: Path, modules: Iterable[str], pyspark_pkg: Path) -> tuple[list[str], list[str]]:
    """The files (relative to `source`) the modules need from pyspark.sql.tests, package
    __init__.py files included, and any pyspark.testing module they import that the wheel lacks."""
    files: set[str] = set()
    missing: set[str] = set()
    todo = list(modules)
    while todo:
        dotted = todo.pop()
        path = module_file(source, dotted)
        if path is None:
            continue
        rel = path.relative_to(source).as_posix()
        if rel in files:
            continue
        files.add(rel)
        parts = dotted.split(".")
        for i in range(3, len(parts)):  # the packages from pyspark.sql.tests down
            init = source / "/".join(parts[:i]) / "__init__.py"
            if init.is_file():
                files.add(init.relative_to(source).as_posix())
        for name in imported_modules(path):
            if name.startswith("pyspark.sql.tests."):
                todo.append(name)
            elif name.startswith("pyspark.testing."):
                sub = pyspark_pkg.parent / name.replace(".", "/")
                if not (sub.with_suffix(".py").is_file() or (sub / "__init__.py").is_file()):
                    # `from pyspark.testing.x import name`: name may be an attribute, not a module
                    parent = sub.parent
                    if not (parent.with_suffix(".py").is_file() or (parent / "__init__.py").is_file()):
                        missing.add(name)
    return sorted(files), sorted(missing)


def build_overlay(work: Path, pyspark_dir: Path, source: Path, files: list[str]) -> Path:
    """work/overlay: the wheel's pyspark package as symlinks, plus the test files under
    pyspark/sql/tests/. Put first on PYTHONPATH."""
    overlay = work / "overlay"
    shutil.rmtree(overlay, ignore_errors=True)
    overlay.mkdir(parents=True)
    for entry in pyspark_dir.iterdir():
        if entry.name not in ("pyspark", ".complete"):
            (overlay / entry.name).symlink_to(entry)
    src_pkg, pkg = pyspark_dir / "pyspark", overlay / "pyspark"
    pkg.mkdir()
    for entry in src_pkg.iterdir():
        if entry.name not in ("sql", "__pycache__"):
            (pkg / entry.name).symlink_to(entry)
    (pkg / "sql").mkdir()
    for entry in (src_pkg / "sql").iterdir():
        if entry.name not in ("tests", "__pycache__"):
            (pkg / "sql" / entry.name).symlink_to(entry)
    for rel in files:
        dest = overlay / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / rel, dest)
    return overlay


def snapshot_pystatestore(work: Path) -> tuple[Path, str]:
    """A copy of the pystatestore package this interpreter imports (with the 4.1 jar in its
    jars/), so a reinstall during the run does not change what runs. Returns its parent dir and
    the package's origin."""
    spec = importlib.util.find_spec("pystatestore")
    if spec is None or spec.origin is None:
        pkg, origin = ROOT / "python" / "pystatestore", "source checkout"
    else:
        pkg, origin = Path(spec.origin).parent, "installed"
    dest = work / "pystatestore-snapshot"
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(pkg, dest / "pystatestore", ignore=shutil.ignore_patterns("__pycache__"))
    jar = dest / "pystatestore" / "jars" / f"pystatestore-shim-spark{MINOR}.jar"
    if not jar.is_file():
        built = ROOT / "jvm-shim" / "build" / "libs" / jar.name
        if not built.is_file():
            raise SystemExit(f"no {jar.name} in {pkg}/jars or {built.parent}: install the wheel or build the jar")
        jar.parent.mkdir(exist_ok=True)
        shutil.copy2(built, jar)
    return dest, f"{origin} package {pkg}"
