"""Compiles the suite's own Scala programs and runs them with spark-submit."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pystatestore

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "tests" / ".build"


def _build_jar_module():
    spec = importlib.util.spec_from_file_location("build_jar", ROOT / "scripts" / "build_jar.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def running_minor() -> str:
    """The Spark minor of the pyspark this process imports (the test command runs several)."""
    import pyspark

    return pystatestore.minor_of(pyspark.__version__)


def minor_test_sources(minor: str) -> list[Path]:
    """The suite's Scala sources for what only `minor`'s API has: tests/jvm/<dir>/ for each of the
    shim's adapter directories of that minor (jvm-shim/src/minors.txt)."""
    dirs = [d.parent.name for d in _build_jar_module().source_dirs(minor) if d.parent.name != "main"]
    return [p for d in dirs for p in sorted((ROOT / "tests" / "jvm" / d).glob("*.scala"))]


def compile_test_jar(name: str, sources: list[Path]) -> Path:
    """Compiles `sources` against the running pyspark's Spark and its shim jar; rebuilt when a
    source is newer."""
    import pyspark

    minor = running_minor()
    out = BUILD / f"{name}-spark{minor}.jar"
    shim = Path(pystatestore.jar_path())
    newest = max(p.stat().st_mtime for p in [*sources, shim])
    if not out.exists() or out.stat().st_mtime < newest:
        jars_dir = Path(pyspark.__file__).resolve().parent / "jars"
        _build_jar_module().compile_jar(
            out, minor, jars_dir=jars_dir, extra_sources=sources, classpath_extra=[str(shim)]
        )
    return out


def spark_submit() -> str:
    import pyspark

    return str(Path(pyspark.__file__).resolve().parent / "bin" / "spark-submit")


def python_path_for_worker() -> str:
    return str(Path(pystatestore.__file__).resolve().parent.parent)


def run_spark_submit(
    main_class: str,
    jar: Path,
    args: list[str],
    *,
    master: str = "local[2]",
    extra_conf: dict[str, str] | None = None,
    timeout: int = 900,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    cmd = [
        spark_submit(),
        "--master",
        master,
        "--class",
        main_class,
        "--jars",
        pystatestore.jar_path(),
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        f"spark.pyspark.python={sys.executable}",
    ]
    for k, v in (extra_conf or {}).items():
        cmd += ["--conf", f"{k}={v}"]
    full_env = dict(os.environ, PYSPARK_PYTHON=sys.executable, **(env or {}))
    return subprocess.run([*cmd, str(jar), *args], capture_output=True, text=True, timeout=timeout, env=full_env)
