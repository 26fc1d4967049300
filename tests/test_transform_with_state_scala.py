"""The Scala transformWithState API (tests/jvm/TransformWithStateJob.scala) on pystatestore equals
Spark's RocksDB provider micro-batch for micro-batch across restarts, each phase its own
spark-submit (a new driver, new executors, new workers): an event-time processor with value, list
and map state and timers that fire and clear state, and a processing-time one with TTL state and
processing-time timers. What Spark's state data source reads of every state variable, and of the
registered timers, at the end is equal too. Spark 4.1 only: 4.2+ refuse transformWithState on any
provider but their RocksDB one (tests/test_spark_limits.py)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from jvm_support import ROOT, compile_test_jar, python_path_for_worker, run_spark_submit, running_minor
from spark_support import OUR_PROVIDER, ROCKSDB_PROVIDER

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(
        running_minor() != "4.1", reason="Spark 4.2+ refuse transformWithState on any provider but their RocksDB one"
    ),
]

PHASES = 3
EVENT_FILES_PER_PHASE = 2
OURS, THEIRS = OUR_PROVIDER.rsplit(".", 1)[-1], ROCKSDB_PROVIDER.rsplit(".", 1)[-1]


def write_file(path: Path, rows: list[dict], order: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    # The file source orders files by mtime; equal mtimes would make batch contents random.
    os.utime(tmp, (1_700_000_000 + order, 1_700_000_000 + order))
    tmp.rename(path)


def write_phase_input(work: Path, phase: int) -> None:
    """Event files of 12 keys each, drifting by 4 a file (so keys go quiet and their timers fire),
    whose event times advance 3 s a file; one processing-time file touching some of 7 keys."""
    for f in range(phase * EVENT_FILES_PER_PHASE, (phase + 1) * EVENT_FILES_PER_PHASE):
        rows = [
            {"key": f"k{f * 4 + i % 12}", "v": (f * 13 + i * 5) % 9, "ts": f"2026-01-01 00:00:{f * 3 + i % 4:02d}"}
            for i in range(30)
        ]
        write_file(work / "in-event" / f"{f:03d}.json", rows, f)
    rows = [{"key": f"p{(phase * 5 + i) % 7}", "v": phase * 100 + i} for i in range(8)]
    write_file(work / "in-processing" / f"{phase:03d}.json", rows, phase)


def read_batches(path: Path) -> list[tuple[int, list[str]]]:
    """The job's "batchId<TAB>rows" lines, in the order the batches ran."""
    batches = []
    for line in path.read_text().splitlines():
        batch_id, _, rows = line.partition("\t")
        batches.append((int(batch_id), rows.split("|") if rows else []))
    return batches


def read_state(path: Path) -> dict[str, list[str]]:
    reads: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        variable, _, row = line.partition("\t")
        reads.setdefault(variable, [])
        if row:
            reads[variable].append(row)
    return reads


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Runs every phase of the job on both providers; the directory with their outputs."""
    jar = compile_test_jar("transform-with-state", [ROOT / "tests" / "jvm" / "TransformWithStateJob.scala"])
    work = tmp_path_factory.mktemp("tws-scala")
    (work / "in-event").mkdir()
    (work / "in-processing").mkdir()
    local_dir = work / "spark-local"
    local_dir.mkdir()
    extra = {
        "spark.sql.streaming.stateStore.pystatestore.pythonPath": python_path_for_worker(),
        "spark.sql.streaming.stateStore.pystatestore.pythonExec": sys.executable,
        "spark.local.dir": str(local_dir),
    }
    for phase in range(PHASES):
        write_phase_input(work, phase)
        mode = "read" if phase == PHASES - 1 else "run"
        proc = run_spark_submit(
            "org.pystatestore.tests.TransformWithStateJob",
            jar,
            [str(work), mode, ROCKSDB_PROVIDER, OUR_PROVIDER],
            extra_conf=extra,
        )
        assert proc.returncode == 0, f"phase {phase} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-6000:]}"
    for query in ("event", "processing"):
        manifests = work / f"ckpt-{query}-{OURS}" / "state" / "0" / "0" / "manifests"
        assert manifests.is_dir(), f"the {query}-time query did not run on pystatestore"
    return work


def test_event_time_micro_batches_equal_rocksdb(work: Path) -> None:
    reference = read_batches(work / f"event-{THEIRS}.out")
    ours = read_batches(work / f"event-{OURS}.out")
    kinds = {row.split(",")[1] for _, rows in reference for row in rows}
    assert kinds == {"input", "expired"}, f"the workload must fire timers too: {kinds}"
    assert len(reference) >= PHASES * EVENT_FILES_PER_PHASE
    assert len(ours) == len(reference)
    for (batch, want), (got_batch, got) in zip(reference, ours, strict=True):
        assert (got_batch, got) == (batch, want), f"batch {batch}"


def test_processing_time_timers_and_ttl_equal_rocksdb(work: Path) -> None:
    """Only batches with output count: how many empty batches a processing-time trigger runs
    between the one that read a file and the stop is timing, and so are the batch ids after it."""
    reference = [rows for _, rows in read_batches(work / f"processing-{THEIRS}.out") if rows]
    ours = [rows for _, rows in read_batches(work / f"processing-{OURS}.out") if rows]
    # Each phase: the batch that read the file, then the one its timers fired in.
    kinds = [sorted({row.split(",")[1] for row in rows}) for rows in reference]
    assert kinds == [["input", "stored"], ["timer"]] * PHASES, kinds
    gone = {row.split("gone=")[1].split(" ")[0] for rows in reference for row in rows if ",stored," not in row}
    assert gone == {"true,true,true"}, f"state with a TTL of 1 ms must be gone by the next batch: {gone}"
    assert len(ours) == len(reference)
    for phase, (want, got) in enumerate(zip(reference, ours, strict=True)):
        assert got == want, f"output {phase}"


def test_state_reader_reads_every_variable_as_on_rocksdb(work: Path) -> None:
    reference = read_state(work / f"state-{THEIRS}.out")
    ours = read_state(work / f"state-{OURS}.out")
    for variable in ("event.count", "event.seen", "event.perValue", "event.timers", "processing.items"):
        assert reference[variable], f"{variable}: nothing to compare"
    assert sorted(ours) == sorted(reference)
    for variable, rows in reference.items():
        assert ours[variable] == rows, f"{variable}: {ours[variable][:3]} vs {rows[:3]}"
