"""A Scala flatMapGroupsWithState sessionization job, compiled by the suite, against the HDFS provider.

Each phase is its own spark-submit, so the restart is a new driver, new executors and new workers.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from jvm_support import ROOT, compile_test_jar, python_path_for_worker, run_spark_submit
from spark_support import HDFS_PROVIDER, MASTERS, OUR_PROVIDER, start_session, write_input_files

pytestmark = pytest.mark.spark


def read_batches(path: Path) -> dict[int, str]:
    batches = {}
    for line in path.read_text().splitlines():
        batch_id, _, rows = line.partition("\t")
        batches[int(batch_id)] = rows
    return batches


# The test command runs the job on local[2] (it also checks the offline reader on the job's
# checkpoint); on local-cluster (3 JVMs a phase: 4 minutes of a contended test command) it is
# slow-marked and runs in `scripts/long.sh slow`: separate executor JVMs are what the end-to-end
# suite's local-cluster queries cover, for every operator.
def _long_on_cluster(master: str) -> object:
    return pytest.param(master, marks=pytest.mark.slow) if master != "local[2]" and len(MASTERS) > 1 else master


@pytest.mark.parametrize("master", [_long_on_cluster(m) for m in MASTERS])
def test_sessionization_matches_builtin_across_restart(master: str, tmp_path: Path) -> None:
    jar = compile_test_jar("sessionization", [ROOT / "tests" / "jvm" / "Sessionization.scala"])
    input_dir = tmp_path / "in"
    local_dir = tmp_path / "spark-local"
    local_dir.mkdir()
    extra = {
        "spark.sql.streaming.stateStore.pystatestore.pythonPath": python_path_for_worker(),
        "spark.sql.streaming.stateStore.pystatestore.pythonExec": sys.executable,
        "spark.local.dir": str(local_dir),
    }
    if master.startswith("local-cluster"):
        extra["spark.executor.memory"] = "768m"
    for phase in range(2):
        write_input_files(input_dir, phase * 3, 3)
        proc = run_spark_submit(
            "org.pystatestore.tests.Sessionization",
            jar,
            [str(input_dir), str(tmp_path), HDFS_PROVIDER, OUR_PROVIDER],
            master=master,
            extra_conf=extra,
        )
        assert proc.returncode == 0, f"phase {phase} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-6000:]}"
    # Every JVM removed its worker logs, exchange files and local databases when it exited. Executor
    # JVMs of local-cluster may still be running their shutdown hooks when spark-submit returns.
    deadline = time.time() + 60
    while True:
        leftovers = sorted(
            str(p.relative_to(local_dir))
            for p in local_dir.glob("pystatestore-*")
            if not p.name.startswith("pystatestore-local-recovery-")  # kept on purpose: it outlives executors
        )
        if not leftovers or time.time() > deadline:
            break
        time.sleep(0.5)
    assert not leftovers, f"left behind: {leftovers}"
    expected = read_batches(tmp_path / "HDFSBackedStateStoreProvider.out")
    actual = read_batches(tmp_path / "PythonStateStoreProvider.out")
    assert len(expected) >= 6
    assert "true" in "".join(expected.values()), "no session expired: the test would not cover timeouts"
    assert actual == expected
    if master == "local[2]":
        state_reader_agrees_with_sparks(tmp_path / "ckpt-PythonStateStoreProvider")


def state_reader_agrees_with_sparks(checkpoint: Path) -> None:
    """`pystatestore read` on the Scala job's checkpoint (a case class as flatMapGroupsWithState's
    state: a nested struct with its timeout) equals `spark.read.format("statestore")`."""
    from test_cli import our_rows, spark_rows

    spark = start_session("local[2]", **{"spark.sql.session.timeZone": "UTC"})
    try:
        theirs = spark_rows(spark, checkpoint)
    finally:
        spark.stop()
    assert theirs and our_rows(checkpoint) == theirs
