"""pystatestore: Flink-style state checkpointing for Spark Structured Streaming, backends in Python.

from pyspark.sql import SparkSession
import pystatestore
spark = pystatestore.configure_spark(SparkSession.builder.master("local[2]")).getOrCreate()
"""

from __future__ import annotations

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

__all__ = [
    "BUILT_AGAINST",
    "CONF_PREFIX",
    "PROVIDER_CLASS",
    "UnsupportedSparkVersionError",
    "__version__",
    "configure_spark",
    "jar_name",
    "jar_path",
    "minor_of",
    "running_pyspark_version",
]
