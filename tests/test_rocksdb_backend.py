"""The rocksdb backend against a real local checkpoint directory (no Spark)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pytest

from backend_support import changes, commit, make_backend, state_of
from pystatestore.errors import CheckpointDamagedError, StoreConfigError


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "state" / "0" / "1"


def manifest(store_dir: Path, version: int) -> dict:
    return json.loads((store_dir / "manifests" / f"{version}.json").read_text())


def test_commits_are_incremental(store_dir: Path, tmp_path: Path) -> None:
    b = make_backend("rocksdb", store_dir, tmp_path)
    rnd = random.Random(1)  # incompressible values: the first version's SSTs are large
    first = commit(b, 0, changes({f"k{i}".encode(): rnd.randbytes(100) for i in range(5000)}), "t1")
    second = commit(b, 1, changes({b"k1": b"changed"}), "t2")
    m1, m2 = manifest(store_dir, 1), manifest(store_dir, 2)
    assert m1["shared"] and all(ref in m2["shared"].values() for ref in m1["shared"].values())
    assert second.metrics["filesReused"] >= len(m1["shared"])
    assert second.metrics["bytesUploaded"] < first.metrics["bytesUploaded"] / 5
    assert all(p.startswith("private/2-") for p in (r["path"] for r in m2["private"].values()))
    assert {"CURRENT", "OPTIONS"} & {n.split("-")[0] for n in m2["private"]}


def test_reload_any_version_in_a_fresh_backend(store_dir: Path, tmp_path: Path) -> None:
    b = make_backend("rocksdb", store_dir, tmp_path)
    expected = {}
    state: dict[bytes, bytes] = {}
    for v in range(1, 6):
        puts = {f"k{v}-{i}".encode(): f"{v}".encode() for i in range(50)}
        deletes = [f"k{v - 1}-{i}".encode() for i in range(10)] if v > 1 else []
        commit(b, v - 1, changes(puts, deletes), f"t{v}")
        state = {**{k: x for k, x in state.items() if k not in deletes}, **puts}
        expected[v] = dict(state)
    b.close()
    fresh = make_backend("rocksdb", store_dir, tmp_path)
    for v in (5, 2, 4, 1, 3):
        assert state_of(fresh, v) == expected[v]
        assert fresh.load(v).num_keys == len(expected[v])


def test_a_competing_attempt_never_makes_us_reuse_a_foreign_file(store_dir: Path, tmp_path: Path) -> None:
    """Two attempts at version 2 from different DB lineages; the last manifest wins, and a later
    commit on top of it must not match its own same-named local SSTs against the winner's."""
    a = make_backend("rocksdb", store_dir, tmp_path / "a")
    commit(a, 0, changes({f"k{i}".encode(): b"base" for i in range(500)}), "t1")
    b = make_backend("rocksdb", store_dir, tmp_path / "b")
    commit(a, 1, changes({f"k{i}".encode(): b"from-a" for i in range(500)}), "attempt-a")
    commit(b, 1, changes({f"k{i}".encode(): b"from-b" for i in range(500)}), "attempt-b")  # wins
    commit(a, 2, changes({b"extra": b"1"}), "t3")  # a's local DB is a's own v2: it must rebuild from b's
    expected = {f"k{i}".encode(): b"from-b" for i in range(500)} | {b"extra": b"1"}
    assert state_of(make_backend("rocksdb", store_dir, tmp_path / "c"), 3) == expected


def test_download_checksum_mismatch_names_the_file(store_dir: Path, tmp_path: Path) -> None:
    commit(make_backend("rocksdb", store_dir, tmp_path), 0, changes({b"a": b"1" * 1000}), "t")
    sst = next((store_dir / "shared").glob("*.sst"))
    data = bytearray(sst.read_bytes())
    data[len(data) // 2] ^= 0x01
    sst.write_bytes(bytes(data))
    with pytest.raises(CheckpointDamagedError) as e:
        make_backend("rocksdb", store_dir, tmp_path / "other").load(1)
    assert f"shared/{sst.name}" in str(e.value) and "version: 1" in str(e.value)


def test_gc_keeps_shared_files_of_retained_versions(store_dir: Path, tmp_path: Path) -> None:
    b = make_backend("rocksdb", store_dir, tmp_path, retain=1)
    commit(b, 0, changes({f"k{i}".encode(): b"v" for i in range(1000)}), "t")
    first_ssts = {r["path"] for r in manifest(store_dir, 1)["shared"].values()}
    for v in range(2, 6):
        commit(b, v - 1, changes({f"n{v}".encode(): b"x"}), f"t{v}")
    b.maintenance(now=1e12)
    referenced = {r["path"] for v in (4, 5) for r in manifest(store_dir, v)["shared"].values()} | {
        r["path"] for v in (4, 5) for r in manifest(store_dir, v)["private"].values()
    }
    on_disk = {
        str(p.relative_to(store_dir)) for d in ("shared", "private") for p in (store_dir / d).rglob("*") if p.is_file()
    }
    assert on_disk == referenced
    assert first_ssts <= on_disk  # still used by the retained versions
    assert sorted(p.name for p in (store_dir / "manifests").iterdir()) == ["4.json", "5.json"]


def stream(table: pa.Table, rows_per_batch: int) -> pa.RecordBatchReader:
    """A change frame as the JVM's arrives: a stream of batches, applied in the order given."""
    return pa.RecordBatchReader.from_batches(table.schema, table.to_batches(max_chunksize=rows_per_batch))


@pytest.mark.parametrize("rows_per_batch", [100, 1], ids=["within-a-batch", "across-batches"])
def test_an_unsorted_frame_is_refused_and_the_store_carries_on(
    store_dir: Path, tmp_path: Path, rows_per_batch: int
) -> None:
    b = make_backend("rocksdb", store_dir, tmp_path)
    commit(b, 0, changes({b"a": b"1"}), "t1")
    unsorted = changes({b"b": b"2", b"d": b"4", b"c": b"3"})  # the JVM sends keys sorted
    with pytest.raises(StoreConfigError) as e:
        b.commit(1, stream(unsorted, rows_per_batch), "t2", num_keys=4)
    assert "not sorted" in str(e.value) and "version: 2" in str(e.value) and str(store_dir) in str(e.value)
    assert not (store_dir / "manifests" / "2.json").exists()
    assert not list(b.work_dir.glob("changes-*")), "the half-written change file was left behind"
    sorted_frame = changes({b"b": b"2", b"c": b"3", b"d": b"4"})
    assert b.commit(1, stream(sorted_frame, rows_per_batch), "t3", num_keys=4).version == 2
    assert state_of(make_backend("rocksdb", store_dir, tmp_path / "fresh"), 2) == {
        b"a": b"1",
        b"b": b"2",
        b"c": b"3",
        b"d": b"4",
    }
