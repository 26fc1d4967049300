"""One of bench.py's streaming queries (benchlib.queries) on one provider, in a driver JVM of its
own: the parent writes what to run as a spec file and starts `python -m benchlib.query SPEC`; the
child runs the query and writes its progress reports beside the spec. bench.py, bench_restore.py
and profile_batches.py run their queries this way."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchlib.child import Watcher, run_child, with_scripts_path

PARTITIONS = 4
RETAIN = 5  # minBatchesToRetain, for every provider
MAINTENANCE = "2s"  # the state store maintenance interval, for every provider


def run_query_in_own_jvm(
    work: Path,
    tag: str,
    sql_conf: dict[str, str],
    input_dir: Path,
    checkpoint: Path,
    *,
    partitions: int = PARTITIONS,
    linger_s: float = 0.0,
    session_conf: dict[str, str] | None = None,
    workload: str = "aggregation",
    watch: Callable[[int], Sequence[Watcher]] = lambda pid: (),
) -> tuple[list[dict], str]:
    """Runs `workload` over everything in `input_dir` with `sql_conf` (the provider class and its
    confs) in a new driver JVM (a new Python process and its SparkSession), `watch`'s samplers on
    that process; returns the progress reports of batches with input and Spark's version."""
    spec_file, result = work / f"{tag}.spec.json", work / f"{tag}.result.json"
    spec = {
        "app": f"pystatestore-bench-{tag}",
        "partitions": partitions,
        "session_conf": session_conf or {},
        "sql_conf": sql_conf,
        "input": str(input_dir),
        "checkpoint": str(checkpoint),
        "linger_s": linger_s,
        "result": str(result),
        "workload": workload,
    }
    spec_file.write_text(json.dumps(spec))
    log = work / f"{tag}.log"
    run = run_child(["-m", "benchlib.query", str(spec_file)], log=log, env=with_scripts_path(), watch=watch)
    if run.returncode != 0 or not result.exists():
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(
            f"bench: the {tag} query's JVM failed (exit {run.returncode}); the end of its log {log}:\n{tail}"
        )
    data = json.loads(result.read_text())
    return data["progress"], data["spark"]


def query_child(spec_file: Path) -> None:
    """The child: one query in this JVM, as `spec_file` says; writes its progress reports (batches
    with input) and Spark's version next to the spec. Lingers after the query so that maintenance
    catches up, as it would in a running query."""
    from pyspark import cloudpickle

    from benchlib import queries
    from benchlib.progress import progress_json
    from benchlib.session import start_session

    # The queries' Python functions go to PySpark's workers whole, as a script's own (__main__)
    # functions do: the workers need not import this package.
    cloudpickle.register_pickle_by_value(queries)
    spec: dict[str, Any] = json.loads(spec_file.read_text())
    os.environ["PYSPARK_PYTHON"] = sys.executable  # a transformWithState processor's init runs in it
    spark = start_session(
        spec["app"],
        partitions=spec["partitions"],
        sql_conf=spec["sql_conf"],
        **{
            "spark.sql.streaming.stateStore.maintenanceInterval": MAINTENANCE,
            "spark.sql.streaming.minBatchesToRetain": str(RETAIN),
            "spark.pyspark.python": sys.executable,  # the tws workload's Python workers need pandas
            **spec["session_conf"],
        },
    )
    progress = queries.WORKLOADS[spec["workload"]](spark, Path(spec["input"]), Path(spec["checkpoint"]))
    time.sleep(spec["linger_s"])
    Path(spec["result"]).write_text(json.dumps({"progress": progress_json(progress), "spark": spark.version}))
    spark.stop()


if __name__ == "__main__":
    query_child(Path(sys.argv[1]))
