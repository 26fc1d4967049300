"""pystatestore: Flink-style state checkpointing for Spark Structured Streaming, backends in Python.

from pyspark.sql import SparkSession
import pystatestore
spark = pystatestore.configure_spark(SparkSession.builder.master("local[2]")).getOrCreate()
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from pystatestore.release import __version__
from pystatestore.spark_minors import BUILT_AGAINST, UnsupportedSparkVersionError, jar_name, minor_of

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


__all__ = [
    "BUILT_AGAINST",
    "CONF_PREFIX",
    "PROVIDER_CLASS",
    "UnsupportedSparkVersionError",
    "__version__",
    "configure_spark",
    "jar_path",
    "minor_of",
]
