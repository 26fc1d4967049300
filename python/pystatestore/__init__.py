"""pystatestore: Flink-style state checkpointing for Spark Structured Streaming, backends in Python.

from pyspark.sql import SparkSession
import pystatestore
spark = pystatestore.configure_spark(SparkSession.builder.master("local[2]")).getOrCreate()

A running query's state, queried while it runs (from its checkpoint, no Spark needed):

client = pystatestore.StateClient("/path/to/checkpoint")
client.get({"user": "u1"})  # Answer(batch=..., found=True, value={...}, partition=...)
"""

from __future__ import annotations

from typing import Any

from pystatestore.release import __version__
from pystatestore.spark_minors import (
    BUILT_AGAINST,
    CONF_PREFIX,
    PROVIDER_CLASS,
    UnsupportedSparkVersionError,
    configure_spark,
    jar_name,
    jar_path,
    minor_of,
    running_pyspark_version,
)


def __getattr__(name: str) -> Any:
    # Loaded on first use: the state workers import this package too, and never need the client.
    if name == "StateClient":
        from pystatestore.queryable import StateClient

        return StateClient
    raise AttributeError(f"module 'pystatestore' has no attribute {name!r}")


__all__ = [
    "BUILT_AGAINST",
    "CONF_PREFIX",
    "PROVIDER_CLASS",
    "StateClient",
    "UnsupportedSparkVersionError",
    "__version__",
    "configure_spark",
    "jar_name",
    "jar_path",
    "minor_of",
    "running_pyspark_version",
]
