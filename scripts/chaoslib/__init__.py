"""chaos.py's own modules: `plan` (what a run draws from its seed), `faults` (the query run with
them: executor kills, stops and restarts), `local_damage` (damaged local copies, the damage kept
on this host) and `checks` (its output, state and
checkpoint judged against the HDFS provider's run and by the referee).

They use the end-to-end suite's queries and Spark helpers: importing this package puts tests/ on
sys.path, and makes PySpark's Python workers on the local cluster's executors (pandas UDFs) run
this interpreter.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "tests"))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
