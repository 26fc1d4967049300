"""The memory backend against a real local checkpoint directory (no Spark)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from backend_support import changes, state_of
from backend_support import make_backend as make_named_backend
from pystatestore.store import frames
from pystatestore.store.backends import StateBackend
from pystatestore.store.errors import CheckpointDamagedError, CheckpointMissingError


def make_backend(store_dir: Path, retain: int = 100, grace: float = 600.0) -> StateBackend:
    return make_named_backend("memory", store_dir, store_dir.parent / "local", retain=retain, grace=grace)


def all_files(d: Path) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*") if p.is_file()}


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "state" / "0" / "3"


def test_commit_then_reload_from_remote_in_a_fresh_backend(store_dir: Path) -> None:
    b = make_backend(store_dir)
    b.commit(0, changes({b"a": b"1", b"b": b"2"}), "t1")
    b.commit(1, changes({b"a": b"10"}, [b"b"]), "t2")
    fresh = make_backend(store_dir)  # a restarted worker: nothing in memory
    first = fresh.load(2)
    assert first.source == "remote" and first.bytes_read > 0
    assert frames.buffer_to_state(first.frame) == {b"a": b"10"}
    again = fresh.load(2)
    assert again.source == "memory" and again.bytes_read == 0
    assert state_of(fresh, 1) == {b"a": b"1", b"b": b"2"}


def test_each_manifest_records_its_commit_step_times(store_dir: Path) -> None:
    """What the report's commit-time plot shows: apply and upload always, restore only when the
    base had to be read back from the checkpoint."""
    b = make_backend(store_dir)
    b.commit(0, changes({b"a": b"1"}), "t1")
    fresh = make_backend(store_dir)  # nothing in memory: version 1 is read back to commit on it
    fresh.commit(1, changes({b"b": b"2"}), "t2")
    timed = [json.loads((store_dir / "manifests" / f"{v}.json").read_text())["commit_ms"] for v in (1, 2)]
    assert timed[0].keys() == {"applyMs", "uploadMs"}
    assert timed[1].keys() == {"restoreMs", "applyMs", "uploadMs"}
    assert all(isinstance(ms, int) and ms >= 0 for t in timed for ms in t.values())


def test_retry_of_a_version_does_not_clobber_the_first_attempt(store_dir: Path) -> None:
    b = make_backend(store_dir)
    b.commit(0, changes({b"a": b"1"}), "attempt-1")
    first = all_files(store_dir)
    b.commit(0, changes({b"a": b"2"}), "attempt-2")
    assert first - {"manifests/1.json"} <= all_files(store_dir)  # the first attempt's data is still there
    assert state_of(make_backend(store_dir), 1) == {b"a": b"2"}  # the manifest decides


def test_truncated_manifest_names_store_version_file_and_deletes_nothing(store_dir: Path) -> None:
    b = make_backend(store_dir)
    b.commit(0, changes({b"a": b"1"}), "t")
    manifest = store_dir / "manifests" / "1.json"
    manifest.write_bytes(manifest.read_bytes()[:40])
    before = all_files(store_dir)
    with pytest.raises(CheckpointDamagedError) as e:
        make_backend(store_dir).load(1)
    msg = str(e.value)
    assert f"file:{store_dir}" in msg and "version: 1" in msg and "manifests/1.json" in msg
    make_backend(store_dir, retain=0).maintenance()
    assert all_files(store_dir) == before


def test_corrupted_manifest_field_is_reported(store_dir: Path) -> None:
    make_backend(store_dir).commit(0, changes({b"a": b"1"}), "t")
    manifest = store_dir / "manifests" / "1.json"
    doc = json.loads(manifest.read_text())
    doc["private"]["snapshot.arrow"]["size"] = "lots"
    manifest.write_text(json.dumps(doc))
    with pytest.raises(CheckpointDamagedError, match="manifests/1.json"):
        make_backend(store_dir).load(1)


def test_missing_snapshot_names_the_file(store_dir: Path) -> None:
    make_backend(store_dir).commit(0, changes({b"a": b"1"}), "t")
    snapshot = next((store_dir / "private").rglob("snapshot.arrow"))
    os.remove(snapshot)
    with pytest.raises(CheckpointMissingError) as e:
        make_backend(store_dir).load(1)
    assert str(snapshot.relative_to(store_dir)) in str(e.value) and "version: 1" in str(e.value)


def test_flipped_byte_in_snapshot_fails_the_checksum(store_dir: Path) -> None:
    make_backend(store_dir).commit(0, changes({b"a": b"1" * 100}), "t")
    snapshot = next((store_dir / "private").rglob("snapshot.arrow"))
    data = bytearray(snapshot.read_bytes())
    data[len(data) // 2] ^= 0xFF
    snapshot.write_bytes(bytes(data))
    with pytest.raises(CheckpointDamagedError, match="checksum"):
        make_backend(store_dir).load(1)


def test_missing_version_is_explained(store_dir: Path) -> None:
    with pytest.raises(CheckpointMissingError, match="never committed"):
        make_backend(store_dir).load(7)


def test_maintenance_applies_retention_and_keeps_retained_versions_loadable(store_dir: Path) -> None:
    b = make_backend(store_dir, retain=2, grace=600)
    expected = {}
    for v in range(1, 8):
        b.commit(v - 1, changes({f"k{v}".encode(): b"x"}), f"t{v}")
        expected[v] = {f"k{i}".encode(): b"x" for i in range(1, v + 1)}
    report = b.maintenance()
    assert report["lowestRetained"] == 5
    assert sorted(p.name for p in (store_dir / "manifests").iterdir()) == ["5.json", "6.json", "7.json"]
    assert len(list((store_dir / "private").iterdir())) == 3
    for v in (5, 6, 7):
        assert state_of(make_backend(store_dir), v) == expected[v]
    with pytest.raises(CheckpointMissingError):
        make_backend(store_dir).load(4)


def test_maintenance_never_deletes_outside_the_store(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    neighbour = tmp_path / "neighbour.txt"
    neighbour.write_text("keep me")
    b = make_backend(store_dir, retain=0)
    for v in range(1, 4):
        b.commit(v - 1, changes({b"k": str(v).encode()}), "t")
    b.maintenance(now=1e12)
    assert neighbour.read_text() == "keep me"
    assert all_files(store_dir) == {
        "manifests/3.json",
        next(str(p.relative_to(store_dir)) for p in (store_dir / "private").rglob("snapshot.arrow")),
    }
