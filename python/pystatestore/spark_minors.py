"""The Spark minors pystatestore supports: one shim jar per minor, chosen by the running pyspark.

Spark's StateStoreProvider changes shape between minors (4.2 changed getStore, 4.3 split
maintenance), so a jar built for one minor fails on another with AbstractMethodError. This module
has no dependencies: the build (scripts/build_jar.py) loads it by path.
"""

from __future__ import annotations

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
