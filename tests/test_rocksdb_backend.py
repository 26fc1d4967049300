"""The rocksdb backend against a real local checkpoint directory (no Spark)."""

from __future__ import annotations

import base64
import json
import logging
import random
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import referee
from backend_support import MODES, changes, commit, make_backend, materialize_if_due, read_view, state_of
from pystatestore.store import changelog, frames
from pystatestore.store.backends.rocksdb import replay as rocksdb_replay
from pystatestore.store.backends.rocksdb.replay import newest_change_per_key
from pystatestore.store.errors import CheckpointDamagedError, StoreConfigError
from pystatestore.store.remote import RemoteFile, RemoteStore
from pystatestore.store.transfer import CHUNK, download_all, upload_all


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "state" / "0" / "1"


def manifest(store_dir: Path, version: int) -> dict:
    return json.loads((store_dir / "manifests" / f"{version}.json").read_text())


def test_snapshot_commits_are_incremental(store_dir: Path, tmp_path: Path) -> None:
    b = make_backend("rocksdb", store_dir, tmp_path, mode="snapshot")
    rnd = random.Random(1)  # incompressible values: the first version's SSTs are large
    first = commit(b, 0, changes({f"k{i}".encode(): rnd.randbytes(100) for i in range(5000)}), "t1")
    second = commit(b, 1, changes({b"k1": b"changed"}), "t2")
    m1, m2 = manifest(store_dir, 1), manifest(store_dir, 2)
    assert m1["shared"] and all(ref in m2["shared"].values() for ref in m1["shared"].values())
    assert second.metrics["filesReused"] >= len(m1["shared"])
    assert second.metrics["bytesUploaded"] < first.metrics["bytesUploaded"] / 5
    # RocksDB's small files are inside the manifest; OPTIONS, the same every version, is stored once
    assert m2["private"] and all("data" in r for r in m2["private"].values())
    assert {"CURRENT", "MANIFEST"} <= {n.split("-")[0] for n in m2["private"]}
    options = [r["path"] for n, r in m2["shared"].items() if n.startswith("OPTIONS")]
    assert options and options == [r["path"] for n, r in m1["shared"].items() if n.startswith("OPTIONS")]
    # so the second commit uploaded its new SSTs and nothing else
    new = [r for r in m2["shared"].values() if r not in m1["shared"].values()]
    assert second.metrics["filesUploaded"] == len(new) and all(r["path"].endswith(".sst") for r in new)


def test_a_small_changelog_commit_writes_one_small_manifest(store_dir: Path, tmp_path: Path) -> None:
    b = make_backend("rocksdb", store_dir, tmp_path)
    commit(b, 0, changes({f"k{i}".encode(): b"v" for i in range(1000)}), "t1")
    before = {p for p in store_dir.rglob("*") if p.is_file()}
    result = commit(b, 1, changes({b"k1": b"changed", b"new": b"1"}, [b"k2"]), "t2")
    written = {p for p in store_dir.rglob("*") if p.is_file()} - before
    assert [p.relative_to(store_dir).as_posix() for p in written] == ["manifests/2.json"]
    doc = manifest(store_dir, 2)
    assert doc["kind"] == "changelog" and doc["changes"]["rows"] == 3 and "data" in doc["changes"]
    assert doc["parent_manifest_id"] == manifest(store_dir, 1)["manifest_id"]
    assert result.bytes_written == (store_dir / "manifests" / "2.json").stat().st_size < 640
    # what readers default (and the store's directory, a diagnostic) is left out; the identity stays
    assert "column_families" not in doc and "key_encoding" not in doc, sorted(doc)
    assert doc["store"] == {"operatorId": 0, "partitionId": 1, "storeName": "default"}
    assert state_of(make_backend("rocksdb", store_dir, tmp_path / "cold"), 2) == (
        {f"k{i}".encode(): b"v" for i in range(1000) if i != 2} | {b"k1": b"changed", b"new": b"1"}
    )


def test_large_changes_go_to_a_changelog_file(store_dir: Path, tmp_path: Path) -> None:
    rnd = random.Random(2)
    b = make_backend("rocksdb", store_dir, tmp_path)
    commit(b, 0, changes({f"k{i}".encode(): rnd.randbytes(100) for i in range(2000)}), "t1")
    doc = manifest(store_dir, 1)
    assert doc["changes"]["path"].startswith("changelog/1-") and (store_dir / doc["changes"]["path"]).is_file()
    assert not (store_dir / "shared").exists()
    assert len(state_of(make_backend("rocksdb", store_dir, tmp_path / "cold"), 1)) == 2000


@pytest.mark.parametrize("mode", MODES)
def test_reload_any_version_in_a_fresh_backend(store_dir: Path, tmp_path: Path, mode: str) -> None:
    b = make_backend("rocksdb", store_dir, tmp_path, mode=mode)
    expected = {}
    state: dict[bytes, bytes] = {}
    for v in range(1, 6):
        puts = {f"k{v}-{i}".encode(): f"{v}".encode() for i in range(50)}
        deletes = [f"k{v - 1}-{i}".encode() for i in range(10)] if v > 1 else []
        commit(b, v - 1, changes(puts, deletes), f"t{v}")
        state = {**{k: x for k, x in state.items() if k not in deletes}, **puts}
        expected[v] = dict(state)
    b.close()
    fresh = make_backend("rocksdb", store_dir, tmp_path, mode=mode)
    for v in (5, 2, 4, 1, 3):
        assert state_of(fresh, v) == expected[v]
        assert fresh.load(v).num_keys == len(expected[v])


@pytest.mark.parametrize("mode", MODES)
def test_a_competing_attempt_never_makes_us_reuse_a_foreign_file(store_dir: Path, tmp_path: Path, mode: str) -> None:
    """Two attempts at version 2 from different DB lineages; the last manifest wins, and a later
    commit on top of it must not match its own same-named local SSTs against the winner's."""
    a = make_backend("rocksdb", store_dir, tmp_path / "a", mode=mode)
    commit(a, 0, changes({f"k{i}".encode(): b"base" for i in range(500)}), "t1")
    b = make_backend("rocksdb", store_dir, tmp_path / "b", mode=mode)
    commit(a, 1, changes({f"k{i}".encode(): b"from-a" for i in range(500)}), "attempt-a")
    commit(b, 1, changes({f"k{i}".encode(): b"from-b" for i in range(500)}), "attempt-b")  # wins
    commit(a, 2, changes({b"extra": b"1"}), "t3")  # a's local DB is a's own v2: it must rebuild from b's
    expected = {f"k{i}".encode(): b"from-b" for i in range(500)} | {b"extra": b"1"}
    assert state_of(make_backend("rocksdb", store_dir, tmp_path / "c"), 3) == expected


@pytest.mark.parametrize("mode", MODES)
def test_download_checksum_mismatch_names_the_file(store_dir: Path, tmp_path: Path, mode: str) -> None:
    options = {"inlineThresholdBytes": "0"}  # the changes in a file of their own
    b = make_backend("rocksdb", store_dir, tmp_path, mode=mode, options=options)
    commit(b, 0, changes({b"a": b"1" * 1000}), "t")
    damaged = next((store_dir / ("shared" if mode == "snapshot" else "changelog")).glob("*"))
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0x01
    damaged.write_bytes(bytes(data))
    with pytest.raises(CheckpointDamagedError) as e:
        make_backend("rocksdb", store_dir, tmp_path / "other", options={"localRecovery": "false"}).load(1)
    assert damaged.relative_to(store_dir).as_posix() in str(e.value) and "version: 1" in str(e.value)


def test_transfers_copy_files_of_any_size_through_one_buffer(tmp_path: Path) -> None:
    """Files shorter than, equal to, and across several transfer chunks arrive whole, with the
    size and checksum of the bytes that were sent."""
    rnd = random.Random(7)
    sizes = [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 12345]
    local = tmp_path / "local"
    local.mkdir()
    for i, size in enumerate(sizes):
        (local / f"{i}.sst").write_bytes(rnd.randbytes(size))
    remote = RemoteStore(f"file:{tmp_path / 'store'}")
    refs = upload_all(remote, [(local / f"{i}.sst", f"shared/{i}.sst") for i in range(len(sizes))], threads=3)
    for i, ref in enumerate(refs):
        data = (local / f"{i}.sst").read_bytes()
        assert (ref.size, ref.checksum) == (len(data), f"crc32:{zlib.crc32(data):08x}")
    back = tmp_path / "back"
    back.mkdir()
    stats = download_all(remote, [(ref, f"{i}.sst") for i, ref in enumerate(refs)], back, threads=3, version=1)
    assert (stats.files, stats.bytes) == (len(sizes), sum(sizes))
    for i in range(len(sizes)):
        assert (back / f"{i}.sst").read_bytes() == (local / f"{i}.sst").read_bytes()


def test_snapshot_gc_keeps_shared_files_of_retained_versions(store_dir: Path, tmp_path: Path) -> None:
    b = make_backend("rocksdb", store_dir, tmp_path, retain=1, mode="snapshot")
    commit(b, 0, changes({f"k{i}".encode(): b"v" for i in range(1000)}), "t")
    first_ssts = {r["path"] for r in manifest(store_dir, 1)["shared"].values()}
    for v in range(2, 6):
        commit(b, v - 1, changes({f"n{v}".encode(): b"x"}), f"t{v}")
    b.maintenance(now=1e12)
    referenced = {
        r["path"]
        for v in (4, 5)
        for kind in ("shared", "private")
        for r in manifest(store_dir, v)[kind].values()
        if "path" in r  # not stored inside the manifest
    }
    on_disk = {
        str(p.relative_to(store_dir)) for d in ("shared", "private") for p in (store_dir / d).rglob("*") if p.is_file()
    }
    assert on_disk == referenced
    assert first_ssts <= on_disk  # still used by the retained versions
    assert sorted(p.name for p in (store_dir / "manifests").iterdir()) == ["4.json", "5.json"]


def files_of(store_dir: Path) -> set[str]:
    return {p.relative_to(store_dir).as_posix() for p in store_dir.rglob("*") if p.is_file()}


def test_maintenance_materializes_a_snapshot_off_the_commit_path(store_dir: Path, tmp_path: Path) -> None:
    """Every minDeltasForSnapshot changelog versions, maintenance snapshots the newest version the
    local DB holds; a restore then starts from it and replays only what came after."""
    b = make_backend("rocksdb", store_dir, tmp_path, retain=100, min_deltas=3, options={"compactSnapshotMaxBytes": "0"})
    state: dict[bytes, bytes] = {}
    for v in range(1, 6):
        puts = {f"k{v}-{i}".encode(): str(v).encode() for i in range(100)}
        commit(b, v - 1, changes(puts), f"t{v}")
        state |= puts
        materialize_if_due(b)
    m3 = manifest(store_dir, 3)
    assert sorted(f for f in files_of(store_dir) if f.startswith("snapshots/")) == [
        f"snapshots/3-{m3['manifest_id']}.json"
    ]
    snap = json.loads((store_dir / "snapshots" / f"3-{m3['manifest_id']}.json").read_text())
    assert snap["kind"] == "snapshot" and snap["version"] == 3 and snap["shared"]
    cold = make_backend("rocksdb", store_dir, tmp_path / "cold", options={"localRecovery": "false"})
    result = cold.load(5)
    assert result.metrics["restoreChangelogVersions"] == 2 and result.metrics["restoreRemoteFiles"] > 0
    assert state_of(cold, 5) == state


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("compact_bytes", ["0", "1048576"])
def test_the_internal_key_count_survives_snapshots_and_restores(
    store_dir: Path, tmp_path: Path, mode: str, compact_bytes: str
) -> None:
    """The JVM's count of keys in internal column families (Spark's numKeys leaves them out) is
    recorded with each version and comes back from every kind of load: the local DB, a restore
    from a snapshot that maintenance made (a database or one segment), and changes replayed."""
    b = make_backend(
        "rocksdb", store_dir, tmp_path, retain=100, min_deltas=3, mode=mode,
        options={"compactSnapshotMaxBytes": compact_bytes},
    )  # fmt: skip
    for v in range(1, 6):
        puts = {f"k{v}-{i}".encode(): str(v).encode() for i in range(100)}
        assert commit(b, v - 1, changes(puts), f"t{v}", num_internal_keys=7 * v).num_internal_keys == 7 * v
        materialize_if_due(b)
    assert b.load(5).num_internal_keys == 35
    if mode == "changelog":
        (snapshot,) = (store_dir / "snapshots").glob("3-*.json")
        assert json.loads(snapshot.read_text())["num_internal_keys"] == 21
    b.close()
    for v in (5, 3, 4, 1):
        cold = make_backend("rocksdb", store_dir, tmp_path / f"cold-{v}", options={"localRecovery": "false"})
        assert cold.load(v).num_internal_keys == 7 * v, f"version {v}"
        cold.close()


def test_a_snapshot_after_small_commits_reuses_the_stores_big_file(store_dir: Path, tmp_path: Path) -> None:
    """Commits touching 1% of the keys each, well past the compaction trigger, must not rewrite the
    whole store: the next snapshot uploads the small runs merged since the last one, not the store
    again (leveled compaction merged every commit's file into the one big file, so every snapshot
    re-uploaded the whole store)."""
    b = make_backend("rocksdb", store_dir, tmp_path, min_deltas=10, options={"compactSnapshotMaxBytes": "0"})
    rnd = random.Random(7)
    keys = [f"k{i:07d}".encode() for i in range(20_000)]
    uploads = []
    for v in range(1, 31):
        touched = keys if v == 1 else rnd.sample(keys, 200)
        commit(b, v - 1, changes({k: rnd.randbytes(40) for k in touched}), f"t{v}")
        job = materialize_if_due(b)
        if job is not None:
            uploads.append(job.metrics["materializeBytesUploaded"])
    assert len(uploads) == 3, uploads  # versions 10, 20 and 30
    assert max(uploads[1:]) < 0.5 * uploads[0], f"snapshot uploads {uploads}: later snapshots re-uploaded the store"


@pytest.mark.parametrize("inline", [True, False])
def test_a_small_store_is_snapshotted_as_one_segment_of_its_state(
    store_dir: Path, tmp_path: Path, inline: bool
) -> None:
    """Below compactSnapshotMaxBytes a snapshot is the whole state as one segment (inside the
    snapshot manifest, or in one changelog/ file): no SSTs, no OPTIONS. Restores and Spark's
    snapshot replay start from it like from any snapshot."""
    options = {} if inline else {"inlineThresholdBytes": "0"}
    b = make_backend("rocksdb", store_dir, tmp_path, retain=100, min_deltas=2, options=options)
    state: dict[bytes, bytes] = {}
    for v in range(1, 4):
        puts = {f"k{v}-{i}".encode(): str(v).encode() * 3 for i in range(50)}
        deletes = [k for k in list(state)[:5]] if v == 3 else []
        commit(b, v - 1, changes(puts, deletes), f"t{v}")
        state = {k: x for k, x in state.items() if k not in deletes} | puts
        materialize_if_due(b)
    m2 = manifest(store_dir, 2)
    snap = json.loads((store_dir / "snapshots" / f"2-{m2['manifest_id']}.json").read_text())
    assert snap["kind"] == "snapshot" and not snap["shared"] and not snap["private"]
    assert snap["changes"]["rows"] == 100 and ("data" in snap["changes"]) == inline
    assert not any((store_dir / "shared").glob("*")) if (store_dir / "shared").exists() else True
    cold = make_backend("rocksdb", store_dir, tmp_path / "cold", options={"localRecovery": "false"})
    result = cold.load(3)
    assert result.metrics["restoreChangelogVersions"] == 1, result.metrics
    # the state segment, and version 3's changes (no local recovery here)
    assert result.metrics["restoreRemoteFiles"] == (0 if inline else 2), result.metrics
    assert result.metrics["restoreInlineSnapshots"] == (1 if inline else 0), result.metrics
    assert result.source == "remote"  # from the checkpoint's snapshot, even when it sits inside a manifest
    assert state_of(cold, 3) == state
    replayed = make_backend("rocksdb", store_dir, tmp_path / "replay", options={"localRecovery": "false"})
    replayed.replay(2, 3)
    assert state_of(replayed, 3) == state


def test_a_compact_snapshot_over_2_kib_is_a_file_while_commits_of_that_size_stay_inline(
    store_dir: Path, tmp_path: Path
) -> None:
    """Base64 adds a third to what is stored inline; a snapshot is made in the background, so its
    state goes to a changelog/ file above 2 KiB, while a commit's changes stay inline up to the
    inline threshold (16 KiB), sparing the commit an upload."""
    rnd = random.Random(3)
    b = make_backend("rocksdb", store_dir, tmp_path, retain=100, min_deltas=1)
    state = {f"k{i:04d}".encode(): rnd.randbytes(20) for i in range(300)}  # ~8 KB, incompressible
    commit(b, 0, changes(state, []), "t1")
    assert "data" in manifest(store_dir, 1)["changes"]
    job = b.prepare_materialization()
    assert job is not None
    b.finish_materialization(job)
    b.complete_materialization(job)
    snap = json.loads((store_dir / "snapshots" / f"1-{manifest(store_dir, 1)['manifest_id']}.json").read_text())
    assert "data" not in snap["changes"] and snap["changes"]["path"].startswith("changelog/"), snap["changes"]
    assert snap["changes"]["size"] > 2048
    cold = make_backend("rocksdb", store_dir, tmp_path / "cold", options={"localRecovery": "false"})
    assert cold.load(1).metrics["restoreRemoteFiles"] == 1
    assert state_of(cold, 1) == state


def test_changelog_gc_keeps_exactly_what_retained_chains_need(store_dir: Path, tmp_path: Path) -> None:
    rnd = random.Random(5)
    b = make_backend("rocksdb", store_dir, tmp_path, retain=2, min_deltas=3, options={"inlineThresholdBytes": "200"})
    expected: dict[int, dict[bytes, bytes]] = {0: {}}
    for v in range(1, 15):
        puts = {f"k{rnd.randrange(300)}".encode(): rnd.randbytes(30) for _ in range(40)}
        deletes = [k for k in expected[v - 1] if rnd.random() < 0.1 and k not in puts]
        commit(b, v - 1, changes(puts, deletes), f"t{v}")
        expected[v] = {k: x for k, x in expected[v - 1].items() if k not in deletes} | puts
        materialize_if_due(b)
        b.maintenance(now=time.time() + 10_000)  # every snapshot is older than the grace by now
    kept = sorted(int(p.stem) for p in (store_dir / "manifests").iterdir())
    assert kept[-3:] == [12, 13, 14] and kept[0] <= 12  # older ones stay only as the chain's start
    for v in (12, 13, 14):
        cold = make_backend("rocksdb", store_dir, tmp_path / f"cold-{v}", options={"localRecovery": "false"})
        assert state_of(cold, v) == expected[v]
    # nothing is left that the retained versions do not need, as the independent referee judges it
    verdict = referee.judge_store(store_dir, min_batches_to_retain=2, now=time.time() + 10_000, grace_seconds=600)
    assert verdict.retained == [12, 13, 14]
    assert verdict.lost == [] and verdict.orphans == [], verdict
    assert set(referee.listing(store_dir)) == verdict.needed


def test_a_replaced_snapshot_goes_without_waiting_for_the_grace_period(store_dir: Path, tmp_path: Path) -> None:
    """Once no retained chain starts from a snapshot (two newer ones on the chain), its files are
    freed by the next maintenance, like any file only expired versions used, not taken for an
    orphan that must age first."""
    b = make_backend("rocksdb", store_dir, tmp_path, retain=1, min_deltas=2)
    for v in range(1, 9):
        commit(b, v - 1, changes({f"k{v}-{i}".encode(): b"x" * 50 for i in range(200)}), f"t{v}")
        materialize_if_due(b)
        b.maintenance()  # right away: every snapshot is younger than the grace period
    snapshots = sorted(int(p.name.split("-")[0]) for p in (store_dir / "snapshots").glob("*.json"))
    # retained 7 and 8: their newest snapshots (6, 8) are young, so the ones before them (4, 6)
    # stay too; 2 went at once
    assert snapshots == [4, 6, 8], snapshots
    verdict = referee.judge_store(store_dir, min_batches_to_retain=1, now=time.time(), grace_seconds=600)
    assert verdict.lost == [] and verdict.orphans == [], verdict
    assert set(referee.listing(store_dir)) == verdict.needed


@pytest.mark.parametrize("mode", MODES)
def test_gc_keeps_the_version_committed_last_when_spark_reruns_older_batches(
    store_dir: Path, tmp_path: Path, mode: str
) -> None:
    """Spark re-runs batches from the start: version 1 is committed again while versions up to 4
    exist, so by number it is below the lowest retained version (2), yet the next commit builds on
    it. Garbage collection by another executor in the middle of that commit keeps it (its manifest,
    its files) whatever its age, so the new version 2 reloads."""
    writer = make_backend("rocksdb", store_dir, tmp_path / "writer", retain=2, grace=60.0, mode=mode, min_deltas=2)
    for v in range(1, 5):
        commit(writer, v - 1, changes({f"old{v}-{i}".encode(): b"x" * 50 for i in range(100)}), f"t{v}")
        materialize_if_due(writer)  # changelog mode: snapshots of 2 and 4 end the old versions' chains
    rerun = {f"new-{i}".encode(): b"y" * 50 for i in range(100)}
    commit(writer, 0, changes(rerun), "rerun-1")
    collector = make_backend("rocksdb", store_dir, tmp_path / "collector", retain=2, grace=60.0, mode=mode)
    reports: list[dict] = []

    def collect_garbage_meanwhile(point: str) -> None:
        if point == "commit:checkpointed" and not reports:
            reports.append(collector.maintenance(now=time.time() + 61))  # everything is past the grace

    writer.fault_hook = collect_garbage_meanwhile
    commit(writer, 1, changes({b"new-more": b"z"}), "rerun-2", num_keys=len(rerun) + 1)
    assert reports and reports[0]["lowestRetained"] == 2, reports
    cold = make_backend("rocksdb", store_dir, tmp_path / "cold", options={"localRecovery": "false"}, mode=mode)
    assert state_of(cold, 2) == rerun | {b"new-more": b"z"}


def test_maintenance_makes_no_snapshot_of_a_version_whose_parent_was_replaced(
    store_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An executor still holds version 3 in its local DB, but version 2 was replaced since (Spark
    re-ran batch 1 elsewhere): version 3's chain cannot be walked. Periodic maintenance makes no
    snapshot of it (Spark commits it again before reading it) and collects garbage as usual; only a
    forced snapshot says why it cannot be made."""
    holder = make_backend("rocksdb", store_dir, tmp_path / "holder", min_deltas=2)
    for v in range(1, 4):
        commit(holder, v - 1, changes({f"k{v}".encode(): b"1"}), f"t{v}", num_keys=v)
    rerun = make_backend("rocksdb", store_dir, tmp_path / "rerun")
    commit(rerun, 1, changes({b"other": b"2"}), "rerun-2", num_keys=2)
    with caplog.at_level(logging.WARNING, logger="pystatestore.rocksdb"):
        assert holder.prepare_materialization() is None
    assert "no snapshot of version 3" in caplog.text and "manifests/2.json" in caplog.text, caplog.text
    assert holder.maintenance()["lowestRetained"] is not None
    with pytest.raises(CheckpointDamagedError, match="holds changes to attempt"):
        holder.prepare_materialization(force=True)
    assert not (store_dir / "snapshots").exists() or not any((store_dir / "snapshots").iterdir())


def test_a_checkpoint_written_in_one_mode_restores_and_continues_in_the_other(store_dir: Path, tmp_path: Path) -> None:
    expected: dict[bytes, bytes] = {}
    modes = ["snapshot", "snapshot", "changelog", "changelog", "snapshot", "changelog"]
    for v, mode in enumerate(modes, start=1):
        b = make_backend("rocksdb", store_dir, tmp_path / f"w{v}", mode=mode, options={"localRecovery": "false"})
        puts = {f"k{v}-{i}".encode(): str(v).encode() for i in range(50)}
        commit(b, v - 1, changes(puts), f"t{v}")
        expected |= puts
        assert manifest(store_dir, v)["kind"] == mode
        b.close()
    cold = make_backend("rocksdb", store_dir, tmp_path / "cold", options={"localRecovery": "false"})
    assert state_of(cold, 6) == expected
    assert cold.load(4).metrics.get("restoreChangelogVersions") == 2  # versions 3 and 4 on snapshot 2


def test_replay_from_a_snapshot_and_the_change_feed(store_dir: Path, tmp_path: Path) -> None:
    b = make_backend("rocksdb", store_dir, tmp_path, min_deltas=2)
    for v in range(1, 6):
        puts = {b"k": str(v).encode(), f"only{v}".encode(): b"x"}
        commit(b, v - 1, changes(puts, [f"only{v - 1}".encode()]), f"t{v}")
        materialize_if_due(b)
    assert b.snapshot_versions() == [2, 4]
    fresh = make_backend("rocksdb", store_dir, tmp_path / "fresh", options={"localRecovery": "false"})
    result = fresh.replay(2, 5)
    assert result.metrics["restoreChangelogVersions"] == 3 and fresh.load(5).metrics == {}  # the DB holds 5 now
    assert state_of(fresh, 5) == {b"k": b"5", b"only5": b"x"}
    with pytest.raises(StoreConfigError, match="no snapshot of version 3") as e:
        fresh.replay(3, 5)
    assert "snapshots: 2, 4" in str(e.value)
    feed = [
        (v, *row) for v, batch in b.changes(4, 5) for row in zip(*(c.to_pylist() for c in batch.columns), strict=True)
    ]
    put, delete = 1, 2
    assert feed == [  # each version's changes in key order, as the JVM sent them
        (4, put, b"k", b"4"),
        (4, delete, b"only3", None),
        (4, put, b"only4", b"x"),
        (5, put, b"k", b"5"),
        (5, delete, b"only4", None),
        (5, put, b"only5", b"x"),
    ]


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


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.dictionaries(st.sampled_from([b"a", b"b", b"c", b"d", b"e"]), st.one_of(st.none(), st.binary(max_size=3))),
        min_size=1,
        max_size=5,
    )
)
def test_merged_replay_keeps_each_keys_newest_change(versions: list[dict[bytes, bytes | None]]) -> None:
    """Versions' changes merged for one ingest leave what applying them one by one leaves (None: a delete)."""
    tables = [
        changes({k: v for k, v in c.items() if v is not None}, [k for k, v in c.items() if v is None]) for c in versions
    ]
    one_by_one: dict[bytes, bytes | None] = {}
    for c in versions:
        one_by_one.update(c)
    merged = newest_change_per_key([t.sort_by([("key", "ascending")]) for t in tables])
    rows = merged.to_pylist()
    assert [r["key"] for r in rows] == sorted(one_by_one)
    assert {r["key"]: (r["value"] if r["op"] == frames.OP_PUT else None) for r in rows} == one_by_one


@pytest.mark.parametrize(
    ("merge_bytes", "files_per_ingest", "ingests_expected"),
    [(256 << 10, 8, 1), (0, 8, 1), (0, 3, 2)],
    ids=["merged", "an-sst-per-version", "two-ingests"],
)
def test_a_restore_replays_a_chain_of_overlapping_changes_in_few_ingests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, merge_bytes: int, files_per_ingest: int, ingests_expected: int
) -> None:
    """Small versions are merged into one SST; larger ones get an SST each, and the SSTs of one
    ingest overlap: the later version's puts and deletes must win."""
    monkeypatch.setattr(rocksdb_replay, "REPLAY_MERGE_BYTES", merge_bytes)
    monkeypatch.setattr(rocksdb_replay, "REPLAY_INGEST_FILES", files_per_ingest)
    store = tmp_path / "store"
    writer = make_backend("rocksdb", store, tmp_path / "w", mode="changelog", options={"localRecovery": "false"})
    steps: list[tuple[dict[bytes, bytes], list[bytes]]] = [
        ({b"a": b"1", b"b": b"1", b"c": b"1"}, []),
        ({b"a": b"2"}, [b"b"]),
        ({b"b": b"3"}, [b"a", b"c"]),
        ({b"c": b"4", b"d": b"4"}, [b"b"]),
    ]
    for v, (puts, deletes) in enumerate(steps):
        commit(writer, v, changes(puts, deletes), f"t{v}")
    ingests: list[str] = []
    reader = make_backend("rocksdb", store, tmp_path / "r", options={"localRecovery": "false"})
    reader.fault_hook = lambda point: ingests.append(point) if point == "restore:replayed" else None
    result = reader.load(4)
    assert result.metrics["restoreChangelogVersions"] == 4 and ingests == ["restore:replayed"] * ingests_expected, (
        result.metrics,
        ingests,
    )
    assert state_of(reader, 4) == {b"c": b"4", b"d": b"4"}


def test_a_damaged_segment_is_not_reported_as_an_unsorted_frame(tmp_path: Path) -> None:
    """The SST writer turns RocksDB's out-of-order error into "the frame is not sorted"; a segment
    whose own check fails with "offsets out of order" must keep its meaning (damage, not a bug in
    the JVM's frame)."""
    b = make_backend("rocksdb", tmp_path / "store", tmp_path / "w")
    commit(b, 0, changes({b"a": b"1"}), "t")

    def damaged() -> Iterator[pa.RecordBatch]:
        raise changelog.SegmentFormatError("offsets out of order")
        yield  # a generator, read lazily like a segment

    with pytest.raises(changelog.SegmentFormatError, match="offsets out of order"):
        b.db.write_change_file(damaged(), 2)


def test_gc_parses_a_settled_manifest_once_and_again_when_it_is_replaced(
    store_dir: Path, tmp_path: Path, monkeypatch
) -> None:  # noqa: ANN001
    """GC runs for every store every maintenance interval: manifests it parsed before and that the
    listing shows unchanged are not read again; a replaced one is, and a fresh one is never kept."""
    import pystatestore.store.backends.base as base_module

    parsed: list[str] = []
    from_json = base_module.Manifest.from_json

    def counting(data: bytes, **kwargs):  # noqa: ANN003, ANN202
        parsed.append(kwargs.get("file", ""))
        return from_json(data, **kwargs)

    monkeypatch.setattr(base_module.Manifest, "from_json", staticmethod(counting))
    b = make_backend("rocksdb", store_dir, tmp_path / "b", min_deltas=100)
    for v in range(5):
        commit(b, v, changes({f"k{v}".encode(): b"x"}), f"t{v}")
    b.maintenance()  # every manifest was written just now: none may be kept
    parsed.clear()
    b.maintenance()
    assert "manifests/5.json" in parsed, "a manifest younger than SETTLED_SECONDS was taken from the cache"
    later = time.time() + base_module.ParsedManifests.SETTLED_SECONDS + 1
    b.maintenance(now=later)
    parsed.clear()
    b.maintenance(now=later)
    assert parsed == [], f"settled, unchanged manifests were parsed again: {parsed}"
    # another attempt replaces version 5 (same size: only the key and attempt differ)
    other = make_backend("rocksdb", store_dir, tmp_path / "other", min_deltas=100)
    replaced = commit(other, 4, changes({b"k9": b"x"}), "t9")
    b.maintenance(now=time.time() + base_module.ParsedManifests.SETTLED_SECONDS + 1)
    assert "manifests/5.json" in parsed
    listed = {f.path: f for f in b.remote.list_files("manifests")}
    assert b.parsed.get(listed["manifests/5.json"]).manifest_id == replaced.manifest_id


def test_parsed_manifests_match_only_the_very_file_listed() -> None:
    from pystatestore.store.backends.context import ParsedManifests
    from pystatestore.store.manifest import Manifest

    cache = ParsedManifests()
    m = Manifest(
        store={},
        version=1,
        base_version=0,
        backend="rocksdb",
        key_schema="",
        value_schema="",
        num_keys=0,
        attempt_id="a",
    )
    now = 1000.0
    cache.put(RemoteFile("manifests/1.json", 10, now - 1), m, now)
    assert cache.get(RemoteFile("manifests/1.json", 10, now - 1)) is None, "stored while it could still change"
    cache.put(RemoteFile("manifests/1.json", 10, now - 5), m, now)
    assert cache.get(RemoteFile("manifests/1.json", 10, now - 5)) is m
    assert cache.get(RemoteFile("manifests/1.json", 11, now - 5)) is None
    assert cache.get(RemoteFile("manifests/1.json", 10, now - 4)) is None
    cache.put(RemoteFile("manifests/2.json", 10, None), m, now)
    assert len(cache) == 1, "a file of unknown age was stored"
    cache.keep_only(set())
    assert cache.get(RemoteFile("manifests/1.json", 10, now - 5)) is None


@pytest.mark.parametrize("mode", MODES)
def test_a_commit_on_an_empty_base_is_a_version_that_needs_no_earlier_one(
    store_dir: Path, tmp_path: Path, mode: str
) -> None:
    """A state rewrite (migrate, repartition) writes a store's whole state as version 8 of a store
    that has no version before it: the version must restore alone, and a later commit build on it."""
    b = make_backend("rocksdb", store_dir, tmp_path, mode=mode)
    state = {f"k{i}".encode(): f"v{i}".encode() for i in range(300)}
    view = tmp_path / "views" / "rewrite"
    result = b.commit(7, changes(state), "rewrite", None, num_keys=len(state), view_dir=str(view), empty_base=True)
    assert result.version == 8 and result.snapshot and read_view(view) == state
    doc = manifest(store_dir, 8)
    assert doc["kind"] == "snapshot" and sorted(p.name for p in (store_dir / "manifests").iterdir()) == ["8.json"]
    commit(b, 8, changes({b"k1": b"changed"}, [b"k2"]), "next")
    cold = make_backend("rocksdb", store_dir, tmp_path / "cold", mode=mode)
    assert state_of(cold, 8) == state
    assert state_of(cold, 9) == {k: v for k, v in state.items() if k != b"k2"} | {b"k1": b"changed"}
    verdict = referee.judge_store(store_dir, required=[8, 9])
    assert not verdict.lost and not verdict.orphans, verdict


def test_the_memory_backend_commits_on_an_empty_base_too(store_dir: Path, tmp_path: Path) -> None:
    b = make_backend("memory", store_dir, tmp_path)
    commit(b, 0, changes({b"old": b"1"}), "t1")
    b.commit(4, changes({b"new": b"2"}), "rewrite", None, num_keys=1, empty_base=True)
    assert state_of(make_backend("memory", store_dir, tmp_path / "cold"), 5) == {b"new": b"2"}


@pytest.mark.parametrize("inline", [True, False], ids=["inline", "file"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("as_stream", [False, True], ids=["table", "stream"])
def test_a_whole_state_written_by_a_rewrite_is_one_segment_not_a_database(
    store_dir: Path, tmp_path: Path, mode: str, inline: bool, as_stream: bool
) -> None:
    """A rewrite's commit on an empty base, with no view asked for, of a state that fits
    compactSnapshotMaxBytes is stored as one segment of its pairs: no SSTs, nothing for the local DB
    to open, ingest and checkpoint. It restores alone, and later commits build on it."""
    options = {} if inline else {"inlineThresholdBytes": "0"}
    b = make_backend("rocksdb", store_dir, tmp_path, mode=mode, options=options)
    state = {f"k{i:03d}".encode(): f"v{i}".encode() for i in range(40)}
    # A rewrite's frame holds puts only, but a delete on an empty base must simply leave nothing.
    frame = changes(state, [b"gone"])
    result = b.commit(7, stream(frame, 7) if as_stream else frame, "rewrite", None, num_keys=40, empty_base=True)
    assert result.version == 8 and result.snapshot
    doc = manifest(store_dir, 8)
    assert doc["kind"] == "snapshot" and not doc["shared"] and not doc["private"], doc
    assert doc["changes"]["rows"] == 40 and ("data" in doc["changes"]) == inline, doc["changes"]
    assert not (store_dir / "shared").exists() or not any((store_dir / "shared").iterdir())
    assert result.metrics["filesUploaded"] == (0 if inline else 1) and result.metrics["filesReused"] == 0
    commit(b, 8, changes({b"k001": b"changed"}, [b"k002"]), "next")
    cold = make_backend("rocksdb", store_dir, tmp_path / "cold", mode=mode, options={"localRecovery": "false"})
    assert state_of(cold, 8) == state
    assert state_of(cold, 9) == {k: v for k, v in state.items() if k != b"k002"} | {b"k001": b"changed"}
    verdict = referee.judge_store(store_dir, required=[8, 9])
    assert not verdict.lost and not verdict.orphans, verdict


@pytest.mark.parametrize("as_stream", [False, True], ids=["table", "stream"])
def test_a_rewritten_state_too_large_for_one_segment_is_a_database_snapshot(
    store_dir: Path, tmp_path: Path, as_stream: bool
) -> None:
    """Past compactSnapshotMaxBytes (here 64 bytes) the whole state is a RocksDB checkpoint, as
    before; a stream read part way to decide so is still committed whole."""
    b = make_backend("rocksdb", store_dir, tmp_path, options={"compactSnapshotMaxBytes": "64"})
    state = {f"k{i:03d}".encode(): f"v{i}".encode() * 4 for i in range(200)}
    frame = changes(state)
    b.commit(7, stream(frame, 9) if as_stream else frame, "rewrite", None, num_keys=200, empty_base=True)
    doc = manifest(store_dir, 8)
    assert doc["kind"] == "snapshot" and "changes" not in doc and doc["shared"], doc
    cold = make_backend("rocksdb", store_dir, tmp_path / "cold", options={"localRecovery": "false"})
    assert state_of(cold, 8) == state


def test_a_damaged_compact_snapshot_in_a_versions_own_manifest_names_that_manifest(
    store_dir: Path, tmp_path: Path
) -> None:
    b = make_backend("rocksdb", store_dir, tmp_path)
    b.commit(2, changes({b"a": b"1", b"b": b"2"}), "rewrite", None, num_keys=2, empty_base=True)
    path = store_dir / "manifests" / "3.json"
    doc = json.loads(path.read_text())
    raw = base64.b64decode(doc["changes"]["data"])[:-9]  # cut short, with a size and checksum to match
    doc["changes"].update(data=base64.b64encode(raw).decode(), size=len(raw), checksum=f"crc32:{zlib.crc32(raw):08x}")
    path.write_text(json.dumps(doc))
    cold = make_backend("rocksdb", store_dir, tmp_path / "cold", options={"localRecovery": "false"})
    with pytest.raises(CheckpointDamagedError) as e:
        cold.load(3)
    assert "not a changelog segment" in str(e.value), str(e.value)
    assert "manifests/3.json" in str(e.value) and "snapshots/" not in str(e.value), str(e.value)


def test_a_changelog_commit_that_uploads_its_changes_reuses_no_file(store_dir: Path, tmp_path: Path) -> None:
    """filesReused counts stored files a commit lists but did not write: a changelog commit whose
    changes went to a file of their own wrote that file and reuses none."""
    b = make_backend("rocksdb", store_dir, tmp_path, mode="changelog", options={"inlineThresholdBytes": "0"})
    first = commit(b, 0, changes({b"a": b"1"}), "t1")
    second = commit(b, 1, changes({b"b": b"2"}), "t2")
    for result in (first, second):
        assert result.metrics["filesUploaded"] == 1 and result.metrics["filesReused"] == 0, result.metrics


COMPACTION_PRIORITY_PROBE = r"""
import json, os, sys, time
import rocksdict
from pystatestore.store.backends.rocksdb.config import db_options

def compaction_threads():
    found = {}
    for tid in os.listdir("/proc/self/task"):
        stat = open(f"/proc/self/task/{tid}/stat").read()
        fields = stat[stat.rindex(")") + 2 :].split()
        if stat[stat.index("(") + 1 : stat.rindex(")")].startswith("rocksdb:low"):
            found[tid] = {"nice": int(fields[16]), "ticks": int(fields[11]) + int(fields[12])}
    return found

opts = db_options(4, create=True)
db = rocksdict.Rdict(sys.argv[1] + "/db", opts)
for run in range(6):  # six overlapping sorted runs: over the trigger of 4, so a compaction runs
    writer = rocksdict.SstFileWriter(opts)
    path = f"{sys.argv[1]}/run{run}.sst"
    writer.open(path)
    for i in range(run, 600_000, 6):
        writer[i.to_bytes(8, "big")] = b"v" * 8
    writer.finish()
    db.ingest_external_file([path])
deadline = time.time() + 30
while time.time() < deadline and not any(t["ticks"] for t in compaction_threads().values()):
    time.sleep(0.05)
time.sleep(0.2)
print(json.dumps(compaction_threads()))
db.close()
"""


def test_compactions_run_at_the_lowest_cpu_priority(tmp_path: Path) -> None:
    """The compaction a commit leaves due must not take a core from the query's next batch (or from a
    restart batch, whose restored DB redoes it): RocksDB's compaction threads run at nice 19. Read
    from /proc in a fresh process, so no earlier test's DB decides which threads exist."""
    out = subprocess.run(
        [sys.executable, "-c", COMPACTION_PRIORITY_PROBE, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    threads = json.loads(out.stdout.strip().splitlines()[-1])
    ran = {tid: t for tid, t in threads.items() if t["ticks"]}
    assert ran, f"no compaction thread ran: {threads}"
    assert {t["nice"] for t in ran.values()} == {19}, threads
