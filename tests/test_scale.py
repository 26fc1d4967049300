"""State larger than the JVM heap (issue 8): the rocksdb backend keeps committed state in RocksDB
views on local disk, read in the JVM through Spark's rocksdbjni, so a query whose state outgrows
the driver heap completes, and a restart restores it exactly.

Runs scripts/bench_scale.py's workload for pystatestore only, in its own driver JVM with Spark's
smallest allowed heap (512 MiB): the key space grows by 1,000,000 keys per batch for 3 batches, then
the query restarts and runs one small batch. With the heap near-cache of releases before 0.3.0 the
same run did not finish in 20 minutes (the JVM spent its time collecting garbage); it now takes
about 30 seconds.
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


def test_state_larger_than_the_heap_completes_and_restores_exactly(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "bench_scale.py"),
            "--providers",
            "pss-rocksdb",
            "--keys-per-batch",
            str(KEYS_PER_BATCH),
            "--batches",
            str(BATCHES),
            "--driver-memory",
            "512m",
            "--timeout",
            "600",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    (result,) = json.loads(out.read_text())
    assert result["completed"], result.get("error")
    assert len(result["batch_ms"]) == BATCHES
    assert result["keys"] == KEYS_PER_BATCH * BATCHES
    # the restart batch touched 5,000 known keys and added 5,000 new ones
    assert result["keys_after_restart"] == KEYS_PER_BATCH * BATCHES + 5_000
