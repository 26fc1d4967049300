"""scripts/build_jar.py, loaded by path (scripts/ is no package): another Spark minor's pyspark for
a benchmark's `--pyspark`, and jars compiled with that minor's own Scala compiler."""

from __future__ import annotations

import functools
import importlib.util
from types import ModuleType

from benchlib import SCRIPTS


@functools.cache
def build_jar() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_jar", SCRIPTS / "build_jar.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reexec_under_pyspark(minor: str | None) -> None:
    """Runs the benchmark again with `minor`'s pyspark first on PYTHONPATH (installed once per
    machine), unless none is asked for or the running pyspark is of that minor already; its child
    processes inherit that PYTHONPATH."""
    if minor:
        build_jar().reexec_under_pyspark(minor)
