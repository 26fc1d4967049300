"""State larger than the JVM heap (issue 8): the rocksdb backend keeps committed state in RocksDB
views on local disk, read in the JVM through Spark's rocksdbjni, so a query whose state outgrows
the driver heap completes, and a restart restores it exactly.

Runs scripts/bench_scale.py's workload in a driver JVM of its own with Spark's smallest allowed
heap (512 MiB): the key space grows by 1,000,000 keys per batch for 3 batches, then the query
restarts and runs one small batch (5,000 known keys counted again, 5,000 new). Every row of the
final state is then read back through Spark's state data source and checked against the input.
The control: Spark's HDFS provider, which keeps state on the heap, cannot finish the same run in
the same JVM (its heap fills in the second batch: the JVM, on Parallel GC with
-XX:+ExitOnOutOfMemoryError, dies of OutOfMemoryError in about 40 s), so the state really is larger
than the heap. With the heap near-cache of releases
before 0.3.0 pystatestore did not finish in 20 minutes either; it now takes about 30 seconds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.spark

KEYS_PER_BATCH = 1_000_000
BATCHES = 3
JVM_OPTIONS = "-XX:+UseParallelGC -XX:+ExitOnOutOfMemoryError"


def run_scale(tmp_path: Path, provider: str, *extra: str, timeout: int = 600) -> dict:
    out = tmp_path / f"results-{provider}.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "bench_scale.py"),
            "--providers",
            provider,
            "--keys-per-batch",
            str(KEYS_PER_BATCH),
            "--batches",
            str(BATCHES),
            "--driver-memory",
            "512m",
            "--timeout",
            str(timeout),
            # The same JVM for both runs: a heap that fills dies at once (Parallel GC's overhead
            # limit, then exit) instead of collecting garbage for minutes.
            f"--driver-java-options={JVM_OPTIONS}",
            "--json",
            str(out),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    (result,) = json.loads(out.read_text())
    return result


def test_state_larger_than_the_heap_completes_and_restores_exactly(tmp_path: Path) -> None:
    result = run_scale(tmp_path, "pss-rocksdb", "--check-state")
    assert result["completed"], result.get("error")
    assert len(result["batch_ms"]) == BATCHES
    assert result["keys"] == KEYS_PER_BATCH * BATCHES
    # the restart batch touched 5,000 known keys and added 5,000 new ones
    total = KEYS_PER_BATCH * BATCHES + 5_000
    assert result["keys_after_restart"] == total
    # every value, read back and checked against the input
    assert result["state_check"] == {"rows": total, "wrong": 0, "unknown_keys": 0, "distinct_keys": total}


# A control of the test above (Spark's HDFS provider fails in that heap): slow, scripts/test.sh leaves it out.
@pytest.mark.slow
def test_the_control_keeping_state_on_the_heap_cannot_finish_in_that_heap(tmp_path: Path) -> None:
    """Spark's HDFS provider keeps every key on the heap: in 512 MiB it runs out of memory."""
    result = run_scale(tmp_path, "spark-hdfs", timeout=300)
    assert not result["completed"], "Spark's HDFS provider finished: the state fits the heap, the test proves nothing"
    assert result["out_of_memory"], f"the control failed for another reason than the heap: {result.get('error')}"
