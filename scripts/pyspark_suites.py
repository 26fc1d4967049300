"""PySpark's own transformWithState test suites, run as a user would against the released pyspark
4.1.4, once with pystatestore as the state store provider and once, unchanged, on Spark's RocksDB
provider as the baseline (issue 33).

Where the tests come from. The released pyspark 4.1.4 on PyPI ships no tests: neither the wheel
nor the source distribution (`pip download --no-binary :all: pyspark==4.1.4`, cached once per
machine under ~/.cache/pystatestore/pyspark-sdist/) holds `pyspark/sql/tests/`; the script checks
that archive first (its member list is cached beside it) and uses its tests should a release ship
them. Otherwise it takes them from `--tests-from DIR`, a Spark source tree (a checkout of the
v4.1.4 tag, or its python/ directory), else from ~/.cache/pystatestore/pyspark-4.1.4-tests/ (a
directory of that layout whose SOURCE.txt says where its files came from). From there it extracts
only the transformWithState test modules (pyspark/sql/tests/**/test_*transform_with_state*.py,
and any *tws* / *state_data_source* / *ttl* module; Spark Connect parity modules are left out:
they need a Spark Connect server) and, transitively, the pyspark.sql.tests modules they import
(the helper with the stateful processors); what they import from pyspark.testing is in the wheel.

How they run. The modules are laid into a copy of the 4.1.4 wheel's pyspark package (symlinks;
only pyspark/sql/tests/ is added), first on PYTHONPATH, so the driver and PySpark's Python
workers import the tests' processors the way they do in a Spark source tree. Each module runs
under unittest in a process (and driver JVM) of its own, once per provider:

- pystatestore: PySpark's suites set `spark.sql.streaming.stateStore.providerClass` to Spark's
  RocksDB provider in their classes' `conf()`. The script replaces that the way a user would: it
  subclasses each test class and overrides `conf()` to take the suite's conf and apply
  `pystatestore.configure_spark` to it (spark.jars += the 4.1 shim jar, providerClass = ours,
  pythonExec = this interpreter, pythonPath), from a snapshot of the installed package taken at
  the start, so a reinstall during the run changes nothing. Each class's setUpClass then checks
  that its session's providerClass is ours, and the run checks every checkpoint the tests leave:
  each must have pystatestore's `state/<op>/<part>/manifests` and none of Spark's RocksDB files;
- rocksdb: the suites as they are.

Both runs get a private TMPDIR and java.io.tmpdir (JAVA_TOOL_OPTIONS), so the checkpoints the tests
create with tempfile can be inspected. The report gives, per module and provider, passed / failed
/ errors / skipped and the run time, and for each failure its test name and the first line of its
error, sorted into failures on pystatestore only, on both, and on RocksDB only; full tracebacks
are in the run directory's results. A later run with the same --work adds its modules to the
report. On 2 cores a module of 60 tests takes about 25 minutes per provider.

    .venv/bin/python scripts/pyspark_suites.py [--providers ours,rocksdb] [--modules all|NAME,...]
        [--only TEST_NAME_PART,...] [--tests-from SPARK_SOURCE_DIR] [--timeout-minutes 120]
        [--work DIR] [--keep-tmp] [--out bench/pyspark-tws-suites-spark4.1.txt]
    .venv/bin/python scripts/pyspark_suites.py --report-only WORK_DIR [--note TEXT]... [--out FILE]
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import hashlib
import importlib
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
import unittest
from collections.abc import Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # build_jar, when imported from elsewhere
from build_jar import cache_dir, pyspark_path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RELEASE = "4.1.4"
MINOR = "4.1"
OURS = "org.pystatestore.PythonStateStoreProvider"
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
PROVIDERS = {"ours": "pystatestore", "rocksdb": "Spark RocksDB"}
TESTS_PREFIX = "pyspark/sql/tests/"
NAME_PARTS = ("transform_with_state", "tws", "state_data_source", "ttl")
PY4J_WRAPPER = "py4j.Py4JException: An exception was raised by the Python Proxy"


# ---------------------------------------------------------------------------------------------
# Sources: the sdist (checked for tests), a Spark source tree, or the cached test directory.


def sdist_archive() -> Path:
    """pyspark-<RELEASE>.tar.gz from PyPI, downloaded once per machine."""
    target = cache_dir() / "pyspark-sdist"
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
        dest = cache_dir() / f"pyspark-{RELEASE}-sdist-tests"
        if not (dest / TESTS_PREFIX).is_dir():
            with tarfile.open(archive) as tar:
                for m in tar.getmembers():
                    if m.name in members:
                        m.name = m.name.split("/", 1)[1]  # strip pyspark-<RELEASE>/
                        tar.extract(m, dest)
        return dest, f"the PyPI sdist {archive.name}"
    note = f"the PyPI sdist {archive.name} holds no {TESTS_PREFIX} (checked {archive})"
    cached = cache_dir() / f"pyspark-{RELEASE}-tests"
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


# ---------------------------------------------------------------------------------------------
# The child: one module on one provider, in a process (and driver JVM) of its own.


class _ConfBuilder:
    """What pystatestore.configure_spark expects of a SparkSession builder, over a SparkConf."""

    def __init__(self, conf: Any) -> None:
        self.conf = conf
        self._options: dict[str, str] = dict(conf.getAll())

    def config(self, key: str, value: str) -> _ConfBuilder:
        self._options[key] = value
        self.conf.set(key, value)
        return self


def on_pystatestore(base: type) -> type:
    """`base` with its conf() on pystatestore, as a user would run a suite on another provider."""
    import pystatestore

    class Suite(base):  # type: ignore[misc, valid-type]
        @classmethod
        def conf(cls) -> Any:
            return pystatestore.configure_spark(_ConfBuilder(super().conf())).conf

        @classmethod
        def setUpClass(cls) -> None:  # noqa: N802
            super().setUpClass()
            used = cls.spark.conf.get(PROVIDER_CONF)
            if used != OURS:
                raise AssertionError(f"the session's {PROVIDER_CONF} is {used}, not {OURS}")

    Suite.__name__ = Suite.__qualname__ = base.__name__  # the same test names on both providers
    Suite.__module__ = base.__module__
    return Suite


def checkpoint_providers(tmp: Path) -> dict[str, str]:
    """Every checkpoint (a directory with state/<op>/<part>/) under `tmp`: which provider's files
    its partitions hold ('pystatestore', 'rocksdb', 'both' or 'none')."""
    found: dict[str, str] = {}
    for state in tmp.rglob("state"):
        root = state.parent
        if not state.is_dir() or not ((root / "offsets").is_dir() or (root / "commits").is_dir()):
            continue
        ours = rocks = False
        for part in state.glob("*/*"):
            if not part.is_dir():
                continue
            names = [p.name for p in part.iterdir()]
            ours |= "manifests" in names
            rocks |= any(n.endswith((".zip", ".changelog")) or n == "SSTs" for n in names)
        found[str(root)] = "both" if ours and rocks else "pystatestore" if ours else "rocksdb" if rocks else "none"
    return found


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return f"{type(err).__name__}: {line}" if line else type(err).__name__


def innermost(err: BaseException) -> str:
    return innermost_in_text(str(err))


def innermost_in_text(text: str) -> str:
    """Where the Python traceback nested in an error's text ends (a foreachBatch function's, after
    Py4J's 'Return Message:'), and its last 'SomeError: ...' line; '' if there is none."""
    if "Return Message: " not in text:
        return ""
    text = text.split("Return Message: ", 1)[1]
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n\s+(.+)', text)
    errors = [ln.strip() for ln in text.splitlines() if re.match(r"^\s*[\w.]+(Error|Exception)\b", ln)]
    where = ""
    if frames:
        path, line, func, code = frames[-1]
        where = f"{func} ({path.rsplit('/', 1)[-1]}:{line}): {code.strip()}"
    return " | ".join(x for x in (errors[-1] if errors else "", where) if x)[:500]


def cause_in_text(text: str) -> str:
    """The last 'Caused by: ...' line of an error's text but Py4J's wrapper of a Python error:
    the JVM error that a Python function inside the test (foreachBatch) ran into."""
    caused = re.findall(r"Caused by: ([^\n]+)", text)
    caused = [c for c in caused if not c.startswith(PY4J_WRAPPER)]
    return caused[-1].strip()[:600] if caused else ""


def deepest_cause(err: BaseException) -> str:
    """cause_in_text of the error, else its innermost JVM cause."""
    found = cause_in_text(str(err))
    if found:
        return found
    causes = [c for c in jvm_causes(err)[1:] if not c.startswith(PY4J_WRAPPER)]
    return causes[-1] if causes else ""


def jvm_causes(err: BaseException) -> list[str]:
    """The first line of each cause of a JVM exception PySpark converted (outermost first)."""
    found: list[str] = []
    throwable = getattr(err, "_origin", None)
    while throwable is not None and len(found) < 12:
        try:
            found.append(str(throwable.toString()).strip().splitlines()[0][:600])
            throwable = throwable.getCause()
        except Exception:  # noqa: BLE001 - a gateway gone away: keep what was read
            break
    return found


class _Recorder(unittest.TestResult):
    """Writes one JSON line per test outcome, with the checkpoints the test left."""

    def __init__(self, out: Any, tmp: Path) -> None:
        super().__init__()
        self.out, self.tmp = out, tmp
        self.seen: set[str] = set()
        self.started = 0.0

    @staticmethod
    def _name(test: unittest.TestCase) -> str:
        if isinstance(test, unittest.case._SubTest):  # type: ignore[attr-defined]
            test = test.test_case
        if not hasattr(test, "_testMethodName"):  # setUpClass / tearDownClass errors
            desc = str(test)  # "setUpClass (module.Class)"
            m = re.match(r"(\w+) \(([\w.]+)\)", desc)
            return f"{m.group(2).rsplit('.', 1)[-1]}.{m.group(1)}" if m else desc
        return f"{type(test).__name__}.{test._testMethodName}"

    def startTest(self, test: unittest.TestCase) -> None:  # noqa: N802
        super().startTest(test)
        self.started = time.monotonic()
        print(f"pyspark_suites: start {self._name(test)}", flush=True)

    def _write(self, test: unittest.TestCase, status: str, err: Any = None, reason: str = "") -> None:
        seconds = round(time.monotonic() - self.started, 1) if self.started else 0
        record: dict[str, Any] = {"test": self._name(test), "status": status, "seconds": seconds}
        if err is not None:
            exc = err[1]
            record["first_line"] = first_line(exc)[:600]
            record["innermost"] = innermost(exc)
            record["causes"] = jvm_causes(exc)
            record["cause"] = deepest_cause(exc)
            record["traceback"] = "".join(traceback.format_exception(*err))[-20000:]
        if reason:
            record["reason"] = reason
        now = checkpoint_providers(self.tmp)
        record["checkpoints"] = {k: v for k, v in now.items() if k not in self.seen}
        self.seen.update(now)
        self.out.write(json.dumps(record) + "\n")
        self.out.flush()
        print(f"pyspark_suites: {status} {record['test']} {record.get('first_line', '')[:200]}", flush=True)

    def addSuccess(self, test: unittest.TestCase) -> None:  # noqa: N802
        super().addSuccess(test)
        self._write(test, "passed")

    def addFailure(self, test: unittest.TestCase, err: Any) -> None:  # noqa: N802
        super().addFailure(test, err)
        self._write(test, "failed", err)

    def addError(self, test: unittest.TestCase, err: Any) -> None:  # noqa: N802
        super().addError(test, err)
        self._write(test, "error", err)

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:  # noqa: N802
        super().addSkip(test, reason)
        self._write(test, "skipped", reason=reason)

    def addExpectedFailure(self, test: unittest.TestCase, err: Any) -> None:  # noqa: N802
        super().addExpectedFailure(test, err)
        self._write(test, "passed", reason="expected failure")

    def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:  # noqa: N802
        super().addUnexpectedSuccess(test)
        self._write(test, "failed", reason="unexpected success")

    def addSubTest(self, test: unittest.TestCase, subtest: unittest.TestCase, err: Any) -> None:  # noqa: N802
        super().addSubTest(test, subtest, err)
        if err is not None:
            self._write(subtest, "failed" if issubclass(err[0], test.failureException) else "error", err)


def child(module: str, provider: str, results: Path, snapshot: str, only: str) -> int:
    import pyspark

    if pyspark.__version__ != RELEASE:
        raise SystemExit(f"the child imports pyspark {pyspark.__version__} from {pyspark.__file__}, not {RELEASE}")
    if provider == "ours":
        sys.path.insert(0, snapshot)
        import pystatestore

        assert Path(pystatestore.__file__).is_relative_to(snapshot), pystatestore.__file__
    mod = importlib.import_module(module)
    classes = [c for c in vars(mod).values()
               if isinstance(c, type) and issubclass(c, unittest.TestCase) and c.__module__ == module]  # fmt: skip
    loader = unittest.TestLoader()
    if only:
        loader.testNamePatterns = [f"*{p.strip()}*" for p in only.split(",") if p.strip()]
    suite = unittest.TestSuite()
    for cls in sorted(classes, key=lambda c: c.__name__):
        suite.addTests(loader.loadTestsFromTestCase(on_pystatestore(cls) if provider == "ours" else cls))
    print(f"pyspark_suites: {module} on {provider}: {suite.countTestCases()} tests "
          f"in {', '.join(c.__name__ for c in classes)}; pyspark from {pyspark.__file__}", flush=True)  # fmt: skip
    with results.open("a") as out:
        suite.run(_Recorder(out, Path(tempfile.gettempdir())))
    return 0


# ---------------------------------------------------------------------------------------------
# The parent: runs every (module, provider) pair, then writes the report.


def run_pair(
    work: Path, overlay: Path, snapshot: Path, module: str, provider: str, timeout_s: float, only: str, keep_tmp: bool
) -> dict:
    name = f"{module.rsplit('.', 1)[-1]}-{provider}"
    results, log = work / f"{name}.jsonl", work / f"{name}.log"
    tmp = work / "tmp" / name
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    results.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_HOME", "PYSPARK_SUBMIT_ARGS")}
    env.update(
        PYTHONPATH=os.pathsep.join(p for p in (str(overlay), env.get("PYTHONPATH")) if p),
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        PYSTATESTORE_TEST_INSTALLED="1",
        TMPDIR=str(tmp),
        JAVA_TOOL_OPTIONS=f"-Djava.io.tmpdir={tmp}",
    )
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", module, "--child-provider", provider,
           "--child-results", str(results), "--child-snapshot", str(snapshot), "--only", only]  # fmt: skip
    print(f"pyspark_suites: {module} on {PROVIDERS[provider]} (log {log})", file=sys.stderr, flush=True)
    started = time.monotonic()
    timed_out = False
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=str(work), start_new_session=True
        )
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, 15)
            try:
                rc = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                rc = proc.wait()
    seconds = time.monotonic() - started
    records = [json.loads(ln) for ln in results.read_text().splitlines()] if results.is_file() else []
    if timed_out:
        running = [ln.split(" start ", 1)[1].strip() for ln in log.read_text().splitlines() if " start " in ln]
        done = {r["test"] for r in records}
        stuck = [t for t in running if t not in done]
        message = f"timeout: the module ran past {timeout_s / 60:.0f} minutes"
        test = stuck[-1] if stuck else f"{module} (timeout)"
        records.append({"test": test, "status": "error", "first_line": message, "checkpoints": {}})
    summary = {"module": module, "provider": provider, "rc": rc, "seconds": round(seconds), "timed_out": timed_out,
               "records": records, "log": str(log)}  # fmt: skip
    (work / f"{name}.json").write_text(json.dumps(summary))
    if not keep_tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    return summary


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--providers", default="ours,rocksdb", help="comma-separated: ours, rocksdb")
    ap.add_argument("--modules", default="all", help="'all' or comma-separated module names (last part is enough)")
    ap.add_argument("--tests-from", help="a Spark source tree (or its python/ dir) to take the test modules from")
    ap.add_argument("--only", default="", help="run only the tests whose names hold one of these (comma-separated)")
    ap.add_argument("--timeout-minutes", type=float, default=120, help="per module and provider")
    ap.add_argument("--work", help="run directory (default: a new one under the system temp dir)")
    ap.add_argument("--out", help="also write the report to this file")
    ap.add_argument("--keep-tmp", action="store_true", help="keep the tests' temp dirs (checkpoints) in WORK/tmp")
    ap.add_argument("--report-only", metavar="WORK", help="only render the report of an earlier run's directory")
    ap.add_argument("--note", action="append", help="with --report-only: add a note to the report (repeatable)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-provider", help=argparse.SUPPRESS)
    ap.add_argument("--child-results", help=argparse.SUPPRESS)
    ap.add_argument("--child-snapshot", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        results = Path(args.child_results)
        raise SystemExit(child(args.child, args.child_provider, results, args.child_snapshot, args.only))

    if args.report_only:
        work = Path(args.report_only)
        meta = json.loads((work / "meta.json").read_text())
        if args.note:
            meta["notes"] = [*meta.get("notes", []), *args.note]
            (work / "meta.json").write_text(json.dumps(meta))
        report = render(work, meta)
    else:
        providers = [p.strip() for p in args.providers.split(",") if p.strip()]
        if not providers or set(providers) - set(PROVIDERS):
            raise SystemExit(f"--providers: give one or more of {', '.join(PROVIDERS)}")
        work = Path(args.work or tempfile.mkdtemp(prefix="pyspark-suites-")).resolve()
        work.mkdir(parents=True, exist_ok=True)
        earlier = json.loads((work / "meta.json").read_text()) if (work / "meta.json").is_file() else {}
        pyspark_dir = pyspark_path(MINOR)
        source, origin = tests_source(args.tests_from)
        modules, connect = discover(source)
        left_out = [f"{m} (Spark Connect parity suite: needs a Spark Connect server)" for m in connect]
        if args.modules != "all":
            wanted = [w.strip() for w in args.modules.split(",") if w.strip()]
            chosen = [m for m in modules if m in wanted or m.rsplit(".", 1)[-1] in wanted]
            unknown = [w for w in wanted if not any(m == w or m.rsplit(".", 1)[-1] == w for m in modules)]
            if unknown:
                raise SystemExit(f"--modules: {', '.join(unknown)} not among {', '.join(modules)}")
            left_out += [f"{m} (not chosen with --modules)" for m in modules if m not in chosen]
            modules = chosen
        files, missing = closure(source, modules, pyspark_dir / "pyspark")
        if missing:
            left_out.append(f"pyspark.testing modules the tests import that the wheel lacks: {', '.join(missing)}")
        overlay = build_overlay(work, pyspark_dir, source, files)
        snapshot, pss_origin = snapshot_pystatestore(work)
        jar = snapshot / "pystatestore" / "jars" / f"pystatestore-shim-spark{MINOR}.jar"
        meta = {
            "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_implementation()} "
            f"{platform.python_version()}, load average {os.getloadavg()[0]:.1f} at the start",
            "command": " ".join(["python", "scripts/pyspark_suites.py", *sys.argv[1:]]),
            "pyspark": RELEASE,
            "pyspark_dir": str(pyspark_dir),
            "pystatestore": pss_origin,
            "jar": jar.name,
            "jar_sha256": hashlib.sha256(jar.read_bytes()).hexdigest(),
            "tests_origin": origin + f"\n  files extracted: {', '.join(files)}",
            "modules": modules,
            "only": args.only,
            "left_out": left_out,
        }
        if earlier:  # a later run in the same work dir adds its modules to the report
            meta["modules"] = list(dict.fromkeys([*earlier["modules"], *modules]))
            meta["left_out"] = [x for x in left_out if x.split(" ", 1)[0] not in meta["modules"]]
            meta["command"] = earlier["command"] + " ; then " + meta["command"]
            meta["date"] = earlier["date"]
        (work / "meta.json").write_text(json.dumps(meta))
        print(f"pyspark_suites: work dir {work}; modules {', '.join(modules)}", file=sys.stderr, flush=True)
        for module in modules:
            for provider in providers:
                run_pair(work, overlay, snapshot, module, provider, args.timeout_minutes * 60, args.only, args.keep_tmp)
        report = render(work, meta)
    print(report, end="")
    if args.out:
        Path(args.out).write_text(report)


if __name__ == "__main__":
    main()
