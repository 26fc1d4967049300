"""The Spark minors pystatestore supports: one shim jar per minor, chosen by the running pyspark.

Spark's StateStoreProvider changes shape between minors (4.2 changed getStore, 4.3 split
maintenance), so a jar built for one minor fails on another with AbstractMethodError. This module
imports nothing of the package and pyspark only when asked for the running version: the build
(scripts/build_jar.py) loads it by path, and every layer (the offline tools too) may use it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

# minor -> the pyspark release its jar is compiled against (any patch release of the minor runs it)
BUILT_AGAINST: dict[str, str] = {"4.1": "4.1.4", "4.2": "4.2.1", "4.3": "4.3.0"}
DEFAULT_MINOR = "4.3"  # what `pip install pyspark` gives a new user
SUPPORTED_RANGE = ">=4.1,<4.4"


class UnsupportedSparkVersionError(RuntimeError):
    """The running pyspark is not a minor this release has a shim jar for."""


def jar_name(minor: str) -> str:
    return f"pystatestore-shim-spark{minor}.jar"


def minor_of(pyspark_version: str) -> str:
    """'4.2.1' -> '4.2'; raises UnsupportedSparkVersionError naming the supported range."""
    parts = pyspark_version.split(".")
    minor = ".".join(parts[:2])
    if len(parts) < 2 or minor not in BUILT_AGAINST:
        supported = ", ".join(f"{m}.x" for m in BUILT_AGAINST)
        raise UnsupportedSparkVersionError(
            f"pystatestore has no shim jar for pyspark {pyspark_version}: it supports {supported} "
            f"(pyspark{SUPPORTED_RANGE}). Install a supported release, e.g. pip install 'pyspark{SUPPORTED_RANGE}'."
        )
    return minor


PROVIDER_CLASS = "org.pystatestore.PythonStateStoreProvider"
CONF_PREFIX = "spark.sql.streaming.stateStore.pystatestore."

_PACKAGE_DIR = Path(__file__).resolve().parent


def running_pyspark_version() -> str:
    import pyspark

    return pyspark.__version__


def jar_path(pyspark_version: str | None = None) -> str:
    """The shim jar for `pyspark_version` (default: the pyspark this Python imports): inside the
    installed wheel, else the gradle/scripts build of a source checkout. A pyspark outside the
    supported minors raises UnsupportedSparkVersionError naming the supported range."""
    version = pyspark_version or running_pyspark_version()
    name = jar_name(minor_of(version))
    candidates = [
        _PACKAGE_DIR / "jars" / name,
        _PACKAGE_DIR.parent.parent / "jvm-shim" / "build" / "libs" / name,
    ]
    for c in candidates:
        if c.is_file():
            return str(c)
    raise FileNotFoundError(
        f"pystatestore shim jar for pyspark {version} not found (looked at {', '.join(map(str, candidates))}). "
        "Install pystatestore with 'pip install .' or build the jar with 'gradle jar'."
    )


def configure_spark(builder: Any, *, python_exec: str | None = None, backend: str | None = None) -> Any:
    """Adds the shim jar of the running pyspark's minor and selects the provider on a SparkSession
    builder; returns the builder.

    The state worker runs `python_exec` (default: this interpreter) with this package on its path,
    so a source checkout works without installation; set both confs yourself on clusters whose
    executors see a different Python.
    """
    options: dict[str, str] = getattr(builder, "_options", {}) or {}
    jars = [j for j in options.get("spark.jars", "").split(",") if j]
    jar = jar_path()
    if jar not in jars:
        jars.append(jar)
    builder = (
        builder.config("spark.jars", ",".join(jars))
        .config("spark.sql.streaming.stateStore.providerClass", PROVIDER_CLASS)
        .config(CONF_PREFIX + "pythonExec", python_exec or sys.executable)
        .config(CONF_PREFIX + "pythonPath", str(_PACKAGE_DIR.parent))
    )
    if backend is not None:
        builder = builder.config(CONF_PREFIX + "backend", backend)
    return builder
