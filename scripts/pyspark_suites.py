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
import datetime as dt
import hashlib
import importlib
import json
import os
import platform
import shutil
import sys
import tempfile
import unittest
from pathlib import Path
from typing import Any

from benchlib.build import build_jar
from benchlib.child import hidden_options, run_child
from benchlib.report import code_version
from suiteslib.record import Recorder
from suiteslib.report import PROVIDERS, render
from suiteslib.sources import MINOR, RELEASE, build_overlay, closure, discover, snapshot_pystatestore, tests_source

OURS = "org.pystatestore.PythonStateStoreProvider"
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"


# ---------------------------------------------------------------------------------------------
# The child: one module on one provider, in a process (and driver JVM) of its own. The suites'
# classes are subclassed here, in the script the child runs, so that whatever of them goes to
# PySpark's Python workers goes whole (as a script's own classes do) rather than by module name.


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
        suite.run(Recorder(out, Path(tempfile.gettempdir())))
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
    argv = [str(Path(__file__).resolve()), "--child", module, "--child-provider", provider,
            "--child-results", str(results), "--child-snapshot", str(snapshot), "--only", only]  # fmt: skip
    print(f"pyspark_suites: {module} on {PROVIDERS[provider]} (log {log})", file=sys.stderr, flush=True)
    # a process group of its own: at the timeout it and everything under it get SIGTERM, then SIGKILL
    run = run_child(argv, timeout=timeout_s, log=log, env=env, cwd=work, new_session=True, term_grace_s=60)
    rc, timed_out, seconds = run.returncode, run.timed_out, run.seconds
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
    hidden_options(ap, "--child", "--child-provider", "--child-results", "--child-snapshot")
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
        pyspark_dir = build_jar().pyspark_path(MINOR)
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
            "code": code_version(),
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
            if earlier.get("code", meta["code"]) != meta["code"]:
                meta["code"] = earlier["code"] + " ; then " + meta["code"]
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
