"""A changelog version's changes file goes once a snapshot of that version exists (decision 0043):
what stays is judged by listing the store directory and by the independent referee, and every
version is read back through a fresh backend."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import referee
from backend_support import changes, commit, make_backend, materialize_if_due, state_of
from pystatestore.reading.checkpoint import SparkCheckpoint, StoreLocation
from pystatestore.reading.store_reader import StoreReader
from pystatestore.store.errors import StoreConfigError
from pystatestore.tools.verification import verify_checkpoint

# Every segment in a file of its own, every snapshot a RocksDB checkpoint.
FILES = {"inlineThresholdBytes": "0", "compactSnapshotMaxBytes": "0"}


def changes_files(store: Path) -> dict[int, int]:
    """changelog/<version>-<token>.changes files by version (a count), read from the directory."""
    found: dict[int, int] = {}
    for p in (store / "changelog").glob("*.changes"):
        v = int(p.name.split("-", 1)[0])
        found[v] = found.get(v, 0) + 1
    return found


def snapshot_versions(store: Path) -> set[int]:
    return {int(p.name.split("-", 1)[0]) for p in (store / "snapshots").glob("*.json")}


def write_versions(store: Path, tmp: Path, count: int, options: dict[str, str]) -> tuple[object, dict]:
    """Commits `count` versions of 200 changed keys each, a snapshot every 2 (min_deltas); returns
    the backend and each version's state."""
    b = make_backend("rocksdb", store, tmp, min_deltas=2, options={**FILES, **options})
    rnd = random.Random(7)
    state: dict[bytes, bytes] = {}
    states = {}
    for v in range(1, count + 1):
        puts = {f"k{rnd.randrange(400)}".encode(): rnd.randbytes(30) for _ in range(200)}
        deletes = [k for k in list(state)[:10] if k not in puts]
        commit(b, v - 1, changes(puts, deletes), f"t{v}", num_keys=len((state | puts).keys() - set(deletes)))
        state = {k: val for k, val in (state | puts).items() if k not in deletes}
        states[v] = dict(state)
        materialize_if_due(b)
    return b, states


def test_a_snapshotted_versions_changes_file_is_deleted_and_every_version_restores(tmp_path: Path) -> None:
    store = tmp_path / "store"
    b, states = write_versions(store, tmp_path / "w", 6, {})
    assert snapshot_versions(store) == {2, 4, 6}
    assert changes_files(store) == {1: 1, 3: 1, 5: 1}  # 2, 4 and 6 live in their snapshots
    verdict = referee.judge_store(store, now=float("inf"), in_flight_seconds=0)
    assert verdict.lost == [] and verdict.orphans == []
    for v in range(1, 7):
        cold = make_backend("rocksdb", store, tmp_path / f"cold{v}", options={"localRecovery": "false"})
        assert state_of(cold, v) == states[v], v


def test_the_change_feed_of_a_snapshotted_version_says_what_to_set(tmp_path: Path) -> None:
    store = tmp_path / "store"
    write_versions(store, tmp_path / "w", 5, {})
    fresh = make_backend("rocksdb", store, tmp_path / "fresh", options={"localRecovery": "false"})
    assert [v for v, _ in fresh.changes(5, 5)] and [v for v, _ in fresh.changes(3, 3)]
    with pytest.raises(StoreConfigError, match="keepSnapshottedChanges=true") as e:
        list(fresh.changes(3, 5))
    assert "version: 4" in str(e.value) and "changelog/4-" in str(e.value)
    with pytest.raises(StoreConfigError, match="replaying version 5 from snapshot 2"):
        fresh.replay(2, 5)


def test_kept_changes_serve_the_change_feed_of_every_version(tmp_path: Path) -> None:
    store = tmp_path / "store"
    b, states = write_versions(store, tmp_path / "w", 5, {"keepSnapshottedChanges": "true"})
    assert changes_files(store) == {v: 1 for v in range(1, 6)}
    b.maintenance(now=float("inf"))
    assert changes_files(store) == {v: 1 for v in range(1, 6)}, "garbage collection took kept changes"
    verdict = referee.judge_store(store, now=float("inf"), in_flight_seconds=0, snapshotted_changes_kept=True)
    assert verdict.lost == [] and verdict.orphans == []
    fresh = make_backend("rocksdb", store, tmp_path / "fresh", options={"localRecovery": "false"})
    assert sorted({v for v, _ in fresh.changes(1, 5)}) == [1, 2, 3, 4, 5]
    fresh.replay(2, 5)
    assert state_of(fresh, 5) == states[5]


def test_a_crash_before_the_delete_leaves_a_file_garbage_collection_removes(tmp_path: Path) -> None:
    store = tmp_path / "store"
    b = make_backend("rocksdb", store, tmp_path / "w", min_deltas=2, grace=10.0, options=FILES)
    for v in (1, 2):
        commit(b, v - 1, changes({f"k{i}".encode(): str(v).encode() * 20 for i in range(300)}), f"t{v}")

    def crash(point: str) -> None:
        if point == "materialize:published":
            raise RuntimeError("worker died")

    b.fault_hook = crash
    with pytest.raises(RuntimeError, match="worker died"):
        materialize_if_due(b)
    b.fault_hook = None
    assert snapshot_versions(store) == {2} and changes_files(store) == {1: 1, 2: 1}
    verdict = referee.judge_store(store, now=float("inf"), in_flight_seconds=0)
    assert verdict.lost == [] and [o for o in verdict.orphans if o.startswith("changelog/2-")], verdict.orphans
    b.maintenance(now=float("inf"))
    assert changes_files(store) == {1: 1}
    assert referee.judge_store(store, now=float("inf"), in_flight_seconds=0).orphans == []


def test_a_restore_whose_changes_file_goes_under_it_restores_from_the_new_snapshot(tmp_path: Path) -> None:
    """A new host plans to restore version 3 from snapshot 2 and version 3's changes; the old host
    snapshots version 3 meanwhile and deletes them. The restore plans again and ends at version 3."""
    store = tmp_path / "store"
    b, states = write_versions(store, tmp_path / "w", 3, {})
    assert snapshot_versions(store) == {2} and 3 in changes_files(store)
    cold = make_backend("rocksdb", store, tmp_path / "cold", options={"localRecovery": "false"})
    fired = []

    def snapshot_meanwhile(point: str) -> None:
        if point == "download:chunk" and not fired:  # reading snapshot 2's files: the plan is made
            fired.append(point)
            job = b.prepare_materialization(force=True)
            b.finish_materialization(job)
            b.complete_materialization(job)

    cold.fault_hook = snapshot_meanwhile
    assert state_of(cold, 3) == states[3]
    assert fired and snapshot_versions(store) == {2, 3} and 3 not in changes_files(store)


def test_the_offline_reader_and_verify_read_a_checkpoint_without_snapshotted_changes(tmp_path: Path) -> None:
    """`pystatestore read` builds a state from its chain's changes where they reach back to version 1;
    with some of them gone it restores instead. `verify` finds nothing missing."""
    store = tmp_path / "store"
    _, states = write_versions(store, tmp_path / "w", 5, {})
    location = StoreLocation(0, 1, "default", f"file:{store}")
    with StoreReader(location) as reader:
        assert dict(reader.state_pairs(5)) == states[5]
    report = verify_checkpoint(SparkCheckpoint(f"file:{tmp_path}", None, [], [], stores=[location]), deep=True)
    assert report.problems == [] and report.files > 0, report.problems
