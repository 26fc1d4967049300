"""Compiles the suite's own Scala programs and runs them with spark-submit; starts a plain JVM
with the shim for what needs a fresh JVM but no Spark."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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


@contextmanager
def plain_jvm(tmpdir: Path) -> Iterator[Any]:
    """A fresh JVM (its py4j view) with Spark's jars and the shim jar but no Spark running, so the
    shim works in java.io.tmpdir, here `tmpdir`: what a JVM does once (choosing its work root) can
    be watched from the start. It exits, running its shutdown hooks, when the block ends."""
    import pyspark
    from py4j.java_gateway import GatewayParameters, JavaGateway, launch_gateway

    classpath = os.pathsep.join([str(Path(pyspark.__file__).resolve().parent / "jars" / "*"), pystatestore.jar_path()])
    port, proc = launch_gateway(
        classpath=classpath, javaopts=[f"-Djava.io.tmpdir={tmpdir}"], die_on_exit=True, return_proc=True
    )
    # No memory management: the JVM goes with the block, and the finalizers of its objects' proxies,
    # run by a later garbage collection, would call a closed gateway.
    gateway = JavaGateway(
        gateway_parameters=GatewayParameters(port=port, auto_convert=True, enable_memory_management=False)
    )
    try:
        yield gateway.jvm
    finally:
        gateway.close()
        proc.stdin.close()  # die_on_exit: the JVM exits on EOF
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
