"""The plan's query run with its faults: the query over its input files, stopped and restarted
where the plan says, and the application's executors killed (SIGKILL). Local copies are damaged
between phases by local_damage.py."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

from pyspark.sql import SparkSession

from benchlib.procfs import children_of, wait_gone, with_args
from chaoslib.plan import FILES, SCENARIOS, Plan
from spark_support import run_phase, write_input_files


def executor_pids(app_id: str) -> list[int]:
    """The executor JVMs of the application `app_id`."""
    return with_args("CoarseGrainedExecutorBackend", app_id)


def kill_executors(app_id: str, timeout: float = 30) -> int:
    """SIGKILLs the application's executor JVMs, then waits for them and their state workers (which
    exit when the JVM's end of their stdin closes) to be gone, so that nothing of theirs touches the
    local copies after the stop. Returns how many executors it killed."""
    executors = executor_pids(app_id)
    tree = children_of()
    children = [pid for executor in executors for pid in tree.get(executor, [])]
    for pid in executors:
        os.kill(pid, signal.SIGKILL)
    wait_gone(executors + children, timeout)
    return len(executors)


def run_query(
    spark: SparkSession, plan: Plan, *, provider: str, run_dir: Path, on_stop: Callable[[], None] | None = None
) -> dict[int, list[tuple]]:
    """The plan's query over FILES input files, stopped and restarted after each of `plan.stops`."""
    build, output_mode = SCENARIOS[plan.scenario]
    input_dir, checkpoint = run_dir / "in", run_dir / "ckpt"
    results: dict[int, list[tuple]] = {}
    bounds = [0, *plan.stops, FILES]
    for start, end in zip(bounds, bounds[1:], strict=False):
        if start > 0 and on_stop is not None:
            on_stop()
        write_input_files(input_dir, start, end - start, seed=plan.seed % 1000)
        run_phase(
            spark,
            build,
            provider=provider,
            input_dir=input_dir,
            checkpoint=checkpoint,
            output_mode=output_mode,
            results=results,
        )
    return results
