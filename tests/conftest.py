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


def pytest_report_header() -> list[str]:
    import pyspark

    return [f"pyspark {pyspark.__version__} from {Path(pyspark.__file__).parent}"]


def pytest_sessionstart() -> None:
    """The test command runs the suites once per Spark minor by putting that minor's pyspark first
    on PYTHONPATH: a run that imported another pyspark would test the wrong jar, so it stops."""
    expected = os.environ.get("PYSTATESTORE_EXPECT_SPARK_MINOR")
    if expected:
        import pyspark

        running = ".".join(pyspark.__version__.split(".")[:2])
        if running != expected:
            import pytest

            pytest.exit(f"this run is meant for Spark {expected}, but imports pyspark {pyspark.__version__}", 4)
