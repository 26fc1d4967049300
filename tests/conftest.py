"""Shared fixtures. Spark sessions live in tests/spark_support.py so pure tests stay Spark-free."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# A source checkout runs against python/; the test command installs the wheel and sets
# PYSTATESTORE_TEST_INSTALLED=1 so the installed package (and its bundled jar) is what is tested.
if os.environ.get("PYSTATESTORE_TEST_INSTALLED") != "1":
    sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "tests"))

# PySpark's own Python workers (pandas UDFs) must run this interpreter, which has pyarrow/pandas.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
