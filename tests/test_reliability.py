"""Reliability and security below Spark: tampered names, mismatched backends and stores, foreign
checkpoints, commit leases against GC, atomic manifests without an overwriting rename, race-free
directory removal, bounded waits in the service, and nothing left behind by failures."""

from __future__ import annotations

import base64
import json
import os
import posixpath
import random
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from backend_support import MODES, changes, commit, hold_at, make_backend, state_of
from pystatestore.store import frames
from pystatestore.store.backends import StateBackend, cleanup
from pystatestore.store.errors import (
    BaseVersionReplacedError,
    CheckpointDamagedError,
    CheckpointMissingError,
    InvalidPathError,
    StoreConfigError,
)
from pystatestore.store.leases import LEASE_DIR, CommitLease, LeaseLostError, validate_grace
from pystatestore.store.manifest import Manifest
from pystatestore.store.remote import RemoteStore, filesystem_for, is_object_store
from pystatestore.worker.service import StoreService

BACKENDS = ["memory", "rocksdb"]
FAR_FUTURE = 1e12


def manifest_file(store: Path, version: int) -> Path:
    return store / "manifests" / f"{version}.json"


def edit_manifest(store: Path, version: int, edit) -> None:  # noqa: ANN001
    path = manifest_file(store, version)
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# -- defect 1: names from a manifest become local file names ----------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", ["../../../escaped", "/tmp/escaped-abs", "sub/escaped", "..", ".hidden", "a\\b"])
def test_a_tampered_file_name_is_refused_before_anything_is_written(tmp_path: Path, backend: str, bad: str) -> None:
    store = tmp_path / "ckpt" / "state" / "0" / "1"
    # A snapshot manifest lists files by name (changelog manifests name none).
    commit(make_backend(backend, store, tmp_path / "w1", mode="snapshot"), 0, changes({b"k": b"v" * 100}), "t")

    def rename_first(doc: dict) -> None:
        name, ref = next(iter(doc["private"].items()))
        del doc["private"][name]
        doc["private"][bad] = ref

    edit_manifest(store, 1, rename_first)
    outside = tmp_path / "outside"
    outside.mkdir()
    before = tree(tmp_path)
    fresh = make_backend(backend, store, outside / "work", options={"localRecovery": "false"})
    with pytest.raises(InvalidPathError) as e:
        fresh.load(1)
    assert "manifests/1.json" in str(e.value) or bad in str(e.value)
    assert "version: 1" in str(e.value)
    fresh.close()
    after = tree(tmp_path)
    assert set(after) == set(before), f"files appeared or vanished: {set(after) ^ set(before)}"
    assert not Path("/tmp/escaped-abs").exists()


@pytest.mark.parametrize("bad", ["../../etc/passwd", "/etc/passwd", "private/../../x", "a//b", "c:/x"])
def test_manifest_paths_outside_the_store_are_refused(tmp_path: Path, bad: str) -> None:
    store = tmp_path / "store"
    commit(make_backend("memory", store, tmp_path / "w"), 0, changes({b"a": b"1"}), "t")
    edit_manifest(store, 1, lambda doc: doc["private"]["snapshot.arrow"].__setitem__("path", bad))
    with pytest.raises(InvalidPathError):
        make_backend("memory", store, tmp_path / "w2").load(1)


def test_gc_never_follows_a_symbolic_link_out_of_the_store(tmp_path: Path) -> None:
    store, victim_dir = tmp_path / "store", tmp_path / "precious"
    victim_dir.mkdir()
    (victim_dir / "data").write_text("keep")
    b = make_backend("memory", store, tmp_path / "w", retain=0)
    for v in range(1, 4):
        commit(b, v - 1, changes({b"k": str(v).encode()}), "t")
    victim_file = tmp_path / "precious-file"
    victim_file.write_text("keep too")
    # a tampered checkpoint: a directory link and a file link into somewhere precious, both looking
    # like an old orphan attempt's files
    dir_link = store / "private" / "1-0123456789abcdef0123456789abcdef"
    file_link = store / "shared" / "0123456789abcdef0123456789abcdef-000009.sst"
    os.symlink(victim_dir, dir_link)
    file_link.parent.mkdir()
    os.symlink(victim_file, file_link)
    b.maintenance(now=FAR_FUTURE)
    assert (victim_dir / "data").read_text() == "keep"
    assert victim_file.read_text() == "keep too"
    # Neither link is followed nor removed: no store writes one, so it is not GC's to delete.
    assert dir_link.is_symlink() and file_link.is_symlink()


def test_a_listing_skips_a_file_deleted_while_it_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GC in another process (maintenance, another attempt) may delete a file between reading its
    directory and its size: the listing goes on without it rather than failing the caller."""
    root = tmp_path / "store"
    (root / "manifests").mkdir(parents=True)
    for v in (1, 2, 3):
        (root / "manifests" / f"{v}.json").write_text("{}")
    real_scandir = os.scandir

    def scandir_then_gc(path: str) -> list[os.DirEntry]:
        entries = list(real_scandir(path))
        (root / "manifests" / "2.json").unlink(missing_ok=True)
        return entries

    monkeypatch.setattr(os, "scandir", scandir_then_gc)
    listed = RemoteStore(f"file:{root}").list_files("manifests")
    assert sorted(f.path for f in listed) == ["manifests/1.json", "manifests/3.json"]


def test_a_restore_never_reads_through_a_symbolic_link_out_of_the_store(tmp_path: Path) -> None:
    store, elsewhere = tmp_path / "store", tmp_path / "elsewhere"
    commit(make_backend("rocksdb", store, tmp_path / "w", mode="snapshot"), 0, changes({b"k": b"1"}), "t")
    elsewhere.mkdir()
    (store / "shared").rename(elsewhere / "shared")  # the same files, but reached through a link
    os.symlink(elsewhere / "shared", store / "shared")
    with pytest.raises(InvalidPathError, match="resolves outside the store"):
        make_backend("rocksdb", store, tmp_path / "fresh").load(1)


def test_a_commit_never_writes_through_a_symbolic_link_out_of_the_store(tmp_path: Path) -> None:
    store, elsewhere = tmp_path / "store", tmp_path / "elsewhere"
    b = make_backend("memory", store, tmp_path / "w")
    commit(b, 0, changes({b"k": b"1"}), "t")
    elsewhere.mkdir()
    (store / "manifests").rename(elsewhere / "manifests")
    os.symlink(elsewhere / "manifests", store / "manifests")
    before = sorted(p.name for p in (elsewhere / "manifests").iterdir())
    with pytest.raises(InvalidPathError, match="resolves outside the store"):
        commit(b, 1, changes({b"k": b"2"}), "t2")
    assert sorted(p.name for p in (elsewhere / "manifests").iterdir()) == before


# -- changelog manifests: their changes and their chain are checked like files ------------------------


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ("../../x.changes", InvalidPathError),
        ("/tmp/x.changes", InvalidPathError),
        ("shared/x.sst", CheckpointDamagedError),
    ],
)
def test_a_tampered_changes_path_is_refused(tmp_path: Path, bad: str, error: type) -> None:
    store = tmp_path / "store"
    b = make_backend("rocksdb", store, tmp_path / "w", options={"inlineThresholdBytes": "0"})  # changes in a file
    commit(b, 0, changes({b"k": b"v"}), "t")
    edit_manifest(store, 1, lambda doc: doc["changes"].__setitem__("path", bad))
    with pytest.raises(error) as e:
        make_backend("rocksdb", store, tmp_path / "w2", options={"localRecovery": "false"}).load(1)
    assert "version: 1" in str(e.value) and "manifests/1.json" in str(e.value)


def test_damaged_inline_changes_are_named(tmp_path: Path) -> None:
    store = tmp_path / "store"
    commit(make_backend("rocksdb", store, tmp_path / "w"), 0, changes({b"k": b"v"}), "t")
    edit_manifest(store, 1, lambda doc: doc["changes"].__setitem__("data", base64.b64encode(b"other").decode()))
    with pytest.raises(CheckpointDamagedError, match="does not match its size and checksum") as e:
        make_backend("rocksdb", store, tmp_path / "w2", options={"localRecovery": "false"}).load(1)
    assert "manifests/1.json" in str(e.value)


def test_a_chain_on_a_replaced_parent_is_refused(tmp_path: Path) -> None:
    """Version 2's changes apply to one attempt at version 1; if the checkpoint holds another,
    replaying them would give a state no commit ever had."""
    store = tmp_path / "store"
    b = make_backend("rocksdb", store, tmp_path / "w")
    commit(b, 0, changes({b"k": b"1"}), "t1")
    commit(b, 1, changes({b"k": b"2"}), "t2")
    edit_manifest(store, 2, lambda doc: doc.__setitem__("parent_manifest_id", "0" * 32))
    with pytest.raises(CheckpointDamagedError, match="holds changes to attempt 0{32} of version 1") as e:
        make_backend("rocksdb", store, tmp_path / "w2", options={"localRecovery": "false"}).load(2)
    assert "version: 2" in str(e.value) and "manifests/1.json" in str(e.value)


def test_a_chain_missing_a_manifest_names_it(tmp_path: Path) -> None:
    store = tmp_path / "store"
    b = make_backend("rocksdb", store, tmp_path / "w")
    for v in range(1, 4):
        commit(b, v - 1, changes({b"k": str(v).encode()}), f"t{v}")
    manifest_file(store, 2).unlink()
    with pytest.raises(CheckpointMissingError) as e:
        make_backend("rocksdb", store, tmp_path / "w2", options={"localRecovery": "false"}).load(3)
    assert "manifests/2.json" in str(e.value)


# -- defect 2: a manifest must belong to this backend and this store ---------------------------------


@pytest.mark.parametrize(("writer", "reader"), [("memory", "rocksdb"), ("rocksdb", "memory")])
def test_a_checkpoint_of_another_backend_is_refused_naming_both(tmp_path: Path, writer: str, reader: str) -> None:
    store = tmp_path / "store"
    w = make_backend(writer, store, tmp_path / "w")
    for v in range(1, 4):
        commit(w, v - 1, changes({b"count": str(v).encode()}), "t")
    before = tree(store)
    r = make_backend(reader, store, tmp_path / "r", options={"localRecovery": "false"})
    for call in (lambda: r.load(3), lambda: commit(r, 3, changes({b"count": b"4"}), "t", num_keys=1)):
        with pytest.raises(StoreConfigError) as e:
            call()
        msg = str(e.value)
        assert f"'{writer}'" in msg and f"'{reader}'" in msg, msg
        assert f"spark.sql.streaming.stateStore.pystatestore.backend={writer}" in msg, msg
    assert tree(store) == before  # nothing written, nothing deleted


def test_a_manifest_of_another_store_is_refused(tmp_path: Path) -> None:
    a, b = tmp_path / "state" / "0" / "1", tmp_path / "state" / "0" / "2"
    commit(make_backend("rocksdb", a, tmp_path / "w"), 0, changes({b"k": b"a"}), "t")
    shutil.copytree(a, b)  # a store directory copied over another partition's
    other = make_backend("rocksdb", b, tmp_path / "w2", options={"localRecovery": "false"})
    other.ctx = type(other.ctx)(**{**other.ctx.__dict__, "partition_id": 2})
    with pytest.raises(CheckpointDamagedError, match="partition 1"):
        other.load(1)


def test_a_foreign_providers_checkpoint_is_named(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (store / "1.delta").write_bytes(b"spark hdfs provider delta")
    with pytest.raises(CheckpointMissingError, match="HDFSBackedStateStoreProvider") as e:
        make_backend("rocksdb", store, tmp_path / "w").load(1)
    assert "providerClass" in str(e.value)


def test_a_restored_db_never_opens_empty_when_the_manifest_has_keys(tmp_path: Path) -> None:
    store = tmp_path / "store"
    commit(make_backend("rocksdb", store, tmp_path / "w", mode="snapshot"), 0, changes({b"k": b"v"}), "t")

    def drop_rocksdb_metadata(doc: dict) -> None:
        for name in [n for n in doc["private"] if n == "CURRENT" or n.startswith("MANIFEST-")]:
            del doc["private"][name]

    edit_manifest(store, 1, drop_rocksdb_metadata)
    fresh = make_backend("rocksdb", store, tmp_path / "w2", options={"localRecovery": "false"})
    with pytest.raises(CheckpointDamagedError, match="version: 1"):
        fresh.load(1)
    assert not list(fresh.work_dir.glob("db-1-*")), "a failed restore left its directory behind"


@pytest.mark.parametrize("mode", MODES)
def test_a_manifest_claiming_keys_over_an_empty_database_is_refused(tmp_path: Path, mode: str) -> None:
    store = tmp_path / "store"
    b = make_backend("rocksdb", store, tmp_path / "w", mode=mode)
    commit(b, 0, changes({b"k": b"v"}), "t1")
    commit(b, 1, changes(deletes=[b"k"]), "t2")  # version 2 is a real, empty database
    edit_manifest(store, 2, lambda doc: doc.__setitem__("num_keys", 5))
    fresh = make_backend("rocksdb", store, tmp_path / "w2", options={"localRecovery": "false"})
    with pytest.raises(CheckpointDamagedError, match="holds 5 keys"):
        fresh.load(2)


@pytest.mark.parametrize("mode", MODES)
def test_a_failed_restore_leaves_no_directory(tmp_path: Path, mode: str) -> None:
    store = tmp_path / "store"
    b = make_backend("rocksdb", store, tmp_path / "w", mode=mode, options={"inlineThresholdBytes": "0"})
    commit(b, 0, changes({b"k": b"v" * 5000}), "t")
    damaged = next((store / ("shared" if mode == "snapshot" else "changelog")).iterdir())  # the SST, or the changes
    damaged.write_bytes(damaged.read_bytes()[:-1] + bytes([damaged.read_bytes()[-1] ^ 1]))
    fresh = make_backend("rocksdb", store, tmp_path / "w2", options={"localRecovery": "false"})
    with pytest.raises(CheckpointDamagedError):
        fresh.load(1)
    assert [p.name for p in fresh.work_dir.iterdir()] == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_commit_on_a_replaced_attempt_of_its_base_is_refused(tmp_path: Path, backend: str) -> None:
    store = tmp_path / "store"
    a = make_backend(backend, store, tmp_path / "a")
    commit(a, 0, changes({b"k": b"1"}), "t1")
    mine = commit(a, 1, changes({b"k": b"a"}), "attempt-a")
    b = make_backend(backend, store, tmp_path / "b")
    theirs = commit(b, 1, changes({b"k": b"b"}), "attempt-b")  # replaces version 2
    with pytest.raises(BaseVersionReplacedError, match="version: 2"):
        commit(a, 2, changes({b"x": b"1"}), "t3", mine.manifest_id)
    assert not manifest_file(store, 3).exists()
    commit(a, 2, changes({b"x": b"1"}), "t3-retry", theirs.manifest_id)
    assert state_of(make_backend(backend, store, tmp_path / "c"), 3) == {b"k": b"b", b"x": b"1"}


# -- defect 3: removing empty directories never loses a file written meanwhile -----------------------


def test_gc_keeps_a_file_written_into_a_directory_it_found_empty(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    store = tmp_path / "store"
    b = make_backend("memory", store, tmp_path / "w", retain=0)
    for v in range(1, 4):
        commit(b, v - 1, changes({b"k": str(v).encode()}), "t")
    late = store / "private" / "1-0123456789abcdef0123456789abcdef" / "late-upload"
    late.parent.mkdir()
    os.utime(late.parent, (1, 1))  # an old, empty directory of a dead attempt...
    real_rmdir = os.rmdir

    def upload_then_rmdir(path, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if os.fspath(path) == str(late.parent):
            late.write_text("uploaded after GC found the directory empty")  # ...written at the last moment
        return real_rmdir(path, *args, **kwargs)

    # The upload lands after every check GC could make and just before the directory is removed:
    # only a removal that refuses a non-empty directory (rmdir) keeps it. (An implementation that
    # never calls rmdir never triggers the upload, and fails the read below.)
    monkeypatch.setattr(os, "rmdir", upload_then_rmdir)
    b.maintenance(now=FAR_FUTURE)
    assert late.read_text().startswith("uploaded after")


def test_gc_removes_the_empty_directories_of_collected_versions(tmp_path: Path) -> None:
    store = tmp_path / "store"
    b = make_backend("memory", store, tmp_path / "w", retain=1)
    for v in range(1, 6):
        commit(b, v - 1, changes({b"k": str(v).encode()}), "t")
    b.maintenance()
    assert sorted(p.name.split("-")[0] for p in (store / "private").iterdir()) == ["4", "5"]


# -- defect 4: orphan grace cannot be outrun by a slow commit ----------------------------------------


@pytest.mark.parametrize("value", ["abc", "-1", "0", "nan", "inf", "9.5"])
def test_absurd_grace_settings_are_refused(value: str) -> None:
    with pytest.raises(StoreConfigError, match="orphanGraceSeconds"):
        validate_grace(value, store="file:/s")


def test_a_commit_slower_than_the_grace_keeps_its_files(tmp_path: Path) -> None:
    """Another instance runs GC, far enough in the future that the first uploads are older than the
    grace, while a slow commit is between uploading and publishing: its lease keeps its files."""
    store = tmp_path / "store"
    grace = 10.0
    slow = make_backend("rocksdb", store, tmp_path / "slow", grace=grace)
    commit(slow, 0, changes({b"a": b"1"}), "t1")
    other = make_backend("rocksdb", store, tmp_path / "other", grace=grace)

    def stall_then_let_gc_run(point: str) -> None:
        if point != "commit:uploaded":
            return
        # Wait (however slow this machine) for the lease to be written well after the uploads, then
        # run GC at a moment when the uploads are older than the grace and the lease is not.
        uploaded_by = time.time()
        deadline = uploaded_by + 60
        written = 0.0
        while written <= uploaded_by + 0.5:
            assert time.time() < deadline, "the commit's lease was not written within 60 s"
            time.sleep(0.05)
            written = max((p.stat().st_mtime for p in (store / "leases").glob("*")), default=0.0)
        other.maintenance(now=written + grace - 0.25)  # uploads over grace + 0.25 s old, the lease under

    slow.fault_hook = stall_then_let_gc_run
    commit(slow, 1, changes({f"k{i}".encode(): b"x" * 50 for i in range(2000)}), "t2")
    reader = make_backend("rocksdb", store, tmp_path / "reader", options={"localRecovery": "false"})
    assert len(state_of(reader, 2)) == 2001


def test_a_commit_that_stalled_past_its_lease_does_not_publish(tmp_path: Path) -> None:
    store = tmp_path / "store"
    b = make_backend("rocksdb", store, tmp_path / "w", grace=10.0)
    commit(b, 0, changes({b"a": b"1"}), "t1")
    offset = [0.0]
    b.clock = lambda: time.time() + offset[0]

    def freeze(point: str) -> None:
        if point == "commit:uploaded":
            offset[0] += 20  # the process was stopped for 20 s: GC elsewhere may have run
            other = make_backend("rocksdb", store, tmp_path / "o", grace=10.0)
            other.maintenance(now=time.time() + 20)

    b.fault_hook = freeze
    with pytest.raises(LeaseLostError, match="version: 2"):
        commit(b, 1, changes({b"b": b"2"}), "t2")
    assert not manifest_file(store, 2).exists()
    assert state_of(make_backend("rocksdb", store, tmp_path / "r"), 1) == {b"a": b"1"}


def rerun_after_gc_of_its_base(tmp_path: Path, mode: str, during_commit: Callable[[StateBackend], None]):  # noqa: ANN201
    """Versions 1-6 are committed with 2 retained; then Spark re-runs batch 3 on another executor,
    which loads version 3 and commits version 4 on it, calling `during_commit` with an instance of
    the store at the commit's point "commit:applied". Returns the store directory, the state the
    re-run commits, and the call's outcome (the result or the exception)."""
    store = tmp_path / "store"
    writer = make_backend("rocksdb", store, tmp_path / "w", retain=2, mode=mode, min_deltas=100)
    state: dict[bytes, bytes] = {}
    for v in range(6):
        state[f"k{v}".encode()] = b"v"
        commit(writer, v, changes({f"k{v}".encode(): b"v"}), f"t{v}")
    rerun = make_backend("rocksdb", store, tmp_path / "rerun", retain=2, mode=mode, min_deltas=100)
    base = state_of(rerun, 3)
    other = make_backend("rocksdb", store, tmp_path / "other", retain=2, mode=mode, min_deltas=100)

    def act(point: str) -> None:
        if point == "commit:applied":
            rerun.fault_hook = None
            during_commit(other)

    rerun.fault_hook = act
    try:
        outcome: object = commit(rerun, 3, changes({b"rerun": b"r"}), "rerun", num_keys=len(base) + 1)
    except CheckpointMissingError as e:
        outcome = e
    return store, {**base, b"rerun": b"r"}, outcome


@pytest.mark.parametrize("mode", MODES)
def test_gc_keeps_the_base_of_a_rerun_batch_below_the_retained_versions(tmp_path: Path, mode: str) -> None:
    """Another executor's GC runs while the re-run commits: version 3 is below the retained versions
    (4-6) and was not written last, but the commit's lease names it, so GC keeps its chain and
    files, and the re-run's version 4 loads."""
    store, expected, outcome = rerun_after_gc_of_its_base(tmp_path, mode, lambda other: other.maintenance())
    assert not isinstance(outcome, Exception), outcome
    reader = make_backend("rocksdb", store, tmp_path / "reader", options={"localRecovery": "false"})
    assert state_of(reader, 4) == expected
    assert not any((store / LEASE_DIR).iterdir()), "the re-run's lease outlived it"
    other = make_backend("rocksdb", store, tmp_path / "gc", retain=2, mode=mode)
    other.maintenance()  # no attempt pins version 3 now: it goes, version 4 (written last) stays
    assert not manifest_file(store, 3).exists() or mode == "changelog"  # a changelog 4 needs 3
    assert state_of(make_backend("rocksdb", store, tmp_path / "reader2"), 4) == expected


def test_a_rerun_whose_base_lost_a_file_anyway_does_not_publish(tmp_path: Path) -> None:
    """GC that planned before the re-run pinned its base (it listed the leases first) removes the
    base's chain while the commit runs: the commit sees it before publishing and refuses, naming the
    file, instead of publishing a version that could never load."""
    removed = []

    def gc_that_listed_before_the_pin(other: StateBackend) -> None:
        path = manifest_file(Path(other.ctx.store_dir.removeprefix("file:")), 2)
        removed.append(path)
        path.unlink()

    store, _, outcome = rerun_after_gc_of_its_base(tmp_path, "changelog", gc_that_listed_before_the_pin)
    assert isinstance(outcome, CheckpointMissingError), outcome
    assert "manifests/2.json" in str(outcome) and "minBatchesToRetain" in str(outcome), outcome
    before = json.loads(manifest_file(store, 4).read_text())
    assert before["attempt_id"] != "rerun", "the re-run published on a base that lost its chain"


def test_gc_looks_for_new_pins_after_planning(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """A re-run pins its base while GC is reading manifests: GC lists the leases again before it
    deletes anything, and keeps the newly pinned version's chain."""
    store = tmp_path / "store"
    # snapshot commits: a version needs no other version's manifest, so only a pin keeps version 3
    writer = make_backend("rocksdb", store, tmp_path / "w", retain=2, mode="snapshot")
    for v in range(6):
        commit(writer, v, changes({f"k{v}".encode(): b"v"}), f"t{v}")
    gc = make_backend("rocksdb", store, tmp_path / "gc", retain=2, mode="snapshot")
    planned = cleanup.needs_by_version
    lease = store / LEASE_DIR / ("c" * 32)

    def pin_while_planning(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        if not lease.parent.exists():  # the first plan only
            lease.parent.mkdir()
            lease.write_text(json.dumps({"version": 4, "token": "c" * 32, "at": time.time(), "base_version": 3}))
        return planned(*args, **kwargs)

    monkeypatch.setattr(cleanup, "needs_by_version", pin_while_planning)
    gc.maintenance()
    assert manifest_file(store, 3).exists(), "GC removed a version pinned while it planned"
    assert state_of(make_backend("rocksdb", store, tmp_path / "r", mode="snapshot"), 3) == {
        f"k{v}".encode(): b"v" for v in range(3)
    }
    assert not manifest_file(store, 2).exists()
    lease.unlink()
    gc.maintenance()
    assert not manifest_file(store, 3).exists(), "unpinned, version 3 should go"


def snapshot_store_past_retention(tmp_path: Path) -> tuple[Path, StateBackend]:
    """Six snapshot commits with retention 2: versions 1-3 are GC's to delete."""
    store = tmp_path / "store"
    writer = make_backend("rocksdb", store, tmp_path / "w", retain=2, mode="snapshot")
    for v in range(6):
        commit(writer, v, changes({f"k{v}".encode(): b"v"}), f"t{v}")
    return store, make_backend("rocksdb", store, tmp_path / "gc", retain=2, mode="snapshot")


def test_gc_deletes_nothing_while_a_live_lease_cannot_be_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Permissions, or an object store's 5xx: what that lease pins is unknown, so dropping it
    could delete the base its commit is building on. The run deletes nothing and says why."""
    store, gc = snapshot_store_past_retention(tmp_path)
    token = "d" * 32
    (store / LEASE_DIR).mkdir()
    (store / LEASE_DIR / token).write_text(json.dumps({"version": 3, "token": token, "at": time.time()}))
    read = RemoteStore.read_bytes

    def refuse_leases(self: RemoteStore, rel: str, **kwargs: object) -> pa.Buffer:
        if rel.startswith(LEASE_DIR + "/"):
            raise PermissionError(13, "Permission denied", rel)
        return read(self, rel, **kwargs)

    monkeypatch.setattr(RemoteStore, "read_bytes", refuse_leases)
    before = tree(store)
    report = gc.maintenance()
    assert tree(store) == before, "GC deleted files while a live lease was unreadable"
    assert report["deletedManifests"] == 0 and report["deletedFiles"] == 0
    assert f"leases/{token}" in caplog.text and "deleted nothing" in caplog.text, caplog.text
    monkeypatch.setattr(RemoteStore, "read_bytes", read)
    gc.maintenance()
    assert not manifest_file(store, 1).exists(), "readable again, the lease pins nothing: version 1 goes"


def test_a_live_lease_that_cannot_be_parsed_keeps_every_manifest(tmp_path: Path) -> None:
    store, gc = snapshot_store_past_retention(tmp_path)
    (store / LEASE_DIR).mkdir()
    (store / LEASE_DIR / ("e" * 32)).write_text('{"version": 4, "base_ver')  # cut short
    gc.maintenance()
    assert all(manifest_file(store, v).exists() for v in range(1, 7))


def test_a_lease_renewal_replaces_the_file_whole(tmp_path: Path) -> None:
    """GC reading a lease while it is renewed sees the old body or the new, never a truncated one:
    the renewal publishes a new file (a new inode), it does not rewrite the old in place."""
    remote = RemoteStore(f"file:{tmp_path / 'store'}")
    lease = CommitLease(remote, "f" * 32, 5, grace_seconds=600)
    with lease:
        lease.pin_base(3)
        path = tmp_path / "store" / LEASE_DIR / ("f" * 32)
        first = path.stat().st_ino
        lease.renew()
        assert path.stat().st_ino != first
        assert json.loads(path.read_text())["base_version"] == 3
        assert sorted(p.name for p in path.parent.iterdir()) == ["f" * 32], "a temporary was left behind"


def lease_written_at(path: Path) -> float:
    try:
        return float(json.loads(path.read_text())["at"])
    except (OSError, ValueError):  # being rewritten this instant
        return 0.0


def wait_for(condition: Callable[[], bool], what: str, seconds: float = 30.0) -> None:
    deadline = time.time() + seconds
    while not condition():
        assert time.time() < deadline, f"not within {seconds:.0f} s: {what}"
        time.sleep(0.05)


def test_leases_of_concurrent_attempts_are_renewed_and_none_outlives_its_attempt(tmp_path: Path) -> None:
    """One thread renews every lease of the process: each live attempt's lease is written every
    quarter of the grace, and an ended attempt's lease is removed and never written again."""
    remote = RemoteStore(f"file:{tmp_path}")
    first = CommitLease(remote, "a" * 32, 1, grace_seconds=10.0)
    second = CommitLease(remote, "b" * 32, 2, grace_seconds=10.0)
    leases = tmp_path / LEASE_DIR
    with first:
        with second:
            assert not leases.exists() or not any(leases.iterdir()), "a fast attempt writes no lease"
            # past the first renewal (a quarter of the grace), however late the renewal thread runs
            wait_for(lambda: {p.name for p in leases.glob("*")} == {"a" * 32, "b" * 32}, "both leases written")
            written = json.loads((leases / ("b" * 32)).read_text())["at"]
        assert not (leases / ("b" * 32)).exists(), "an ended attempt's lease stays"
        wait_for(lambda: lease_written_at(leases / ("a" * 32)) > written, "the live lease renewed")
        assert not (leases / ("b" * 32)).exists(), "an ended attempt's lease was written again"
        first.check_before_publish()
    assert not any(leases.iterdir())


# -- defect 5: manifests are atomic where rename cannot replace a file (HDFS) ------------------------


class NoReplaceRename(pafs.FileSystemHandler):
    """The local filesystem, but `move` refuses an existing destination, as HDFS's rename does;
    `fail_moves` makes the next moves fail, as a crash between two renames would."""

    def __init__(self) -> None:
        self.local = pafs.LocalFileSystem()
        self.fail_moves = 0

    def get_type_name(self) -> str:
        return "no-replace"

    def normalize_path(self, path: str) -> str:
        return path

    def get_file_info(self, paths):  # noqa: ANN001, ANN201
        return self.local.get_file_info(paths)

    def get_file_info_selector(self, selector):  # noqa: ANN001, ANN201
        return self.local.get_file_info(selector)

    def create_dir(self, path: str, recursive: bool) -> None:
        self.local.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self.local.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self.local.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        raise OSError("not allowed")

    def delete_file(self, path: str) -> None:
        self.local.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        if self.fail_moves:
            self.fail_moves -= 1
            raise OSError("crash")
        if os.path.exists(dest):
            raise OSError(f"rename {src} -> {dest}: destination exists")
        self.local.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        self.local.copy_file(src, dest)

    def open_input_stream(self, path: str):  # noqa: ANN201
        return self.local.open_input_stream(path)

    def open_input_file(self, path: str):  # noqa: ANN201
        return self.local.open_input_file(path)

    def open_output_stream(self, path: str, metadata):  # noqa: ANN001, ANN201
        return self.local.open_output_stream(path)

    def open_append_stream(self, path: str, metadata):  # noqa: ANN001, ANN201
        return self.local.open_append_stream(path)


def hdfs_like_backend(store: Path, local: Path, handler: NoReplaceRename) -> StateBackend:
    b = make_backend("memory", store, local)
    b.remote = RemoteStore(f"file:{store}", fs=pafs.PyFileSystem(handler), root=str(store))
    assert not b.remote.is_local and not b.remote.object_store
    return b


@pytest.mark.parametrize(
    ("uri", "object_store"),
    [
        ("s3a://bucket/chk/state/0/1?region=us-east-1", True),  # Hadoop's scheme, as Spark spells it
        ("s3://bucket/chk/state/0/1?region=us-east-1", True),
        ("gs://bucket/chk/state/0/1", True),
        ("file:/chk/state/0/1", False),
        ("/chk/state/0/1", False),
    ],
)
def test_object_stores_are_told_from_local_disks(uri: str, object_store: bool) -> None:
    """Object stores get single-PUT publishing (no rename); the object-store modules load lazily,
    so this is decided from the filesystem's type name."""
    fs, path = filesystem_for(uri)
    assert is_object_store(fs) is object_store
    assert path.endswith("chk/state/0/1")


def test_a_test_fault_can_wait_for_a_later_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fault seam's "after": the point passes that many times, then the rule fires `times` times."""
    from pystatestore.worker import faults

    rule = {"store": "/later/", "point": "commit:applied", "action": "fail", "after": 2, "times": 1}
    monkeypatch.setenv(faults.ENV, json.dumps([rule]))
    monkeypatch.setattr(faults, "_fired", {})
    monkeypatch.setattr(faults, "_passed", {})
    b = make_backend("rocksdb", tmp_path / "later" / "store", tmp_path / "local")
    faults.install(b)
    commit(b, 0, changes({b"a": b"1"}), "t1")
    commit(b, 1, changes({b"b": b"2"}), "t2")
    with pytest.raises(faults.InjectedFaultError):
        commit(b, 2, changes({b"c": b"3"}), "t3")
    commit(b, 2, changes({b"c": b"3"}), "t4")  # fired its one time
    assert state_of(b, 3) == {b"a": b"1", b"b": b"2", b"c": b"3"}


def test_a_test_fault_fires_once_across_worker_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With "once", a worker that replaced one that fired the rule (fresh counters) does not fire it."""
    from pystatestore.worker import faults

    marker = tmp_path / "fired"
    record = tmp_path / "fired.txt"
    rule = {"store": "/once/", "point": "commit:applied", "action": "fail", "once": str(marker), "record": str(record)}
    monkeypatch.setenv(faults.ENV, json.dumps([rule]))
    monkeypatch.setattr(faults, "_passed", {})
    b = make_backend("rocksdb", tmp_path / "once" / "store", tmp_path / "local")
    for attempt in ("t1", "t2"):
        monkeypatch.setattr(faults, "_fired", {})  # as in a new worker process
        faults.install(b)
        if attempt == "t1":
            with pytest.raises(faults.InjectedFaultError):
                commit(b, 0, changes({b"a": b"1"}), attempt)
        else:
            commit(b, 0, changes({b"a": b"1"}), attempt)
    assert marker.exists() and state_of(b, 1) == {b"a": b"1"}
    assert record.read_text().split()[:3] == ["0", "commit:applied", "fail"]  # one line: it fired once


def test_a_partial_upload_fails_its_commit_and_gc_removes_it(tmp_path: Path) -> None:
    """A transfer that dies part-way through a file (the seam's "upload:chunk") leaves a partial
    file under the store: the commit fails, the retry commits, and GC past the grace removes it."""
    from pystatestore.store.transfer import CHUNK

    store = tmp_path / "store"
    b = make_backend("rocksdb", store, tmp_path / "local", mode="snapshot")
    rnd = random.Random(3)  # incompressible: the first SST spans several transfer chunks
    table = changes({f"k{i:05d}".encode(): rnd.randbytes(300) for i in range(3 * CHUNK // 300)})

    def die_mid_file(point: str) -> None:
        if point == "upload:chunk":
            raise OSError("injected: the connection dropped mid-file")

    b.fault_hook = die_mid_file
    with pytest.raises(OSError, match="mid-file"):
        commit(b, 0, table, "t1")
    partial = [p for p in (store / "shared").rglob("*") if p.is_file()]
    # every file stopped after its first chunk: the large SST is cut short at the chunk size
    assert any(p.stat().st_size == CHUNK for p in partial), [p.stat().st_size for p in partial]
    assert not (store / "manifests" / "1.json").exists()
    b.fault_hook = None
    commit(b, 0, table, "t2")
    assert len(state_of(b, 1)) == table.num_rows
    b.maintenance(now=time.time() + 3600)
    assert not [p for p in partial if p.exists()], "GC past the grace left the partial upload"
    needed = {
        r.path
        for r in Manifest.from_json(
            (store / "manifests" / "1.json").read_bytes(), store=str(store), version=1, file="manifests/1.json"
        ).files()
    }
    left = {
        p.relative_to(store).as_posix() for d in ("shared", "private") for p in (store / d).rglob("*") if p.is_file()
    }
    assert left == needed


class NoDirectoryTimes(NoReplaceRename):
    """Like S3: directories (prefixes) have no modification time. Records directory deletions."""

    def __init__(self) -> None:
        super().__init__()
        self.deleted_dirs: list[str] = []

    def get_file_info_selector(self, selector):  # noqa: ANN001, ANN201
        infos = self.local.get_file_info(selector)
        return [pafs.FileInfo(i.path, i.type) if i.type == pafs.FileType.Directory else i for i in infos]

    def delete_dir(self, path: str) -> None:
        self.deleted_dirs.append(posixpath.basename(path))
        super().delete_dir(path)


def test_gc_never_judges_a_directory_of_unknown_age_old(tmp_path: Path) -> None:
    """On object stores a new attempt's directory has no age: it must not be taken for a dead
    attempt's and removed (with a recursive delete) while the attempt writes its first file."""
    store, handler = tmp_path / "store", NoDirectoryTimes()
    b = make_backend("memory", store, tmp_path / "w", retain=0)
    b.remote = RemoteStore(f"file:{store}", fs=pafs.PyFileSystem(handler), root=str(store))
    for v in range(1, 4):
        commit(b, v - 1, changes({b"k": str(v).encode()}), "t")
    starting = "4-0123456789abcdef0123456789abcdef"  # an attempt that has not written its lease yet
    (store / "private" / starting).mkdir()
    b.maintenance(now=FAR_FUTURE)
    assert starting not in handler.deleted_dirs and (store / "private" / starting).is_dir()
    # the emptied directories of published versions below the retained one still go
    assert sorted(d.split("-")[0] for d in handler.deleted_dirs) == ["1", "2"]


def test_manifest_replace_works_without_an_overwriting_rename(tmp_path: Path) -> None:
    store, handler = tmp_path / "store", NoReplaceRename()
    b = hdfs_like_backend(store, tmp_path / "w", handler)
    commit(b, 0, changes({b"k": b"first"}), "attempt-1")
    commit(b, 0, changes({b"k": b"retry"}), "attempt-2")  # Spark retries version 1: the last one wins
    assert state_of(hdfs_like_backend(store, tmp_path / "r", handler), 1) == {b"k": b"retry"}
    assert not [p for p in (store / "manifests").iterdir() if p.name.startswith(".tmp-")]


def test_a_crash_between_the_two_renames_loses_nothing(tmp_path: Path) -> None:
    store, handler = tmp_path / "store", NoReplaceRename()
    b = hdfs_like_backend(store, tmp_path / "w", handler)
    commit(b, 0, changes({b"k": b"first"}), "attempt-1")
    real_move = handler.move
    moves = []

    def crash_on_second_move(src: str, dest: str) -> None:
        moves.append(dest)
        if len(moves) == 3:  # tmp -> final failed (exists), final -> aside done; now the crash
            raise OSError("worker died")
        real_move(src, dest)

    handler.move = crash_on_second_move
    with pytest.raises(OSError, match="worker died"):
        commit(b, 0, changes({b"k": b"retry"}), "attempt-2")
    handler.move = real_move
    assert not manifest_file(store, 1).exists()
    reader = hdfs_like_backend(store, tmp_path / "r", handler)
    assert state_of(reader, 1) == {b"k": b"first"}  # the set-aside manifest is still the version
    reader.maintenance(now=FAR_FUTURE)  # ... and GC keeps what it references
    assert state_of(hdfs_like_backend(store, tmp_path / "r2", handler), 1) == {b"k": b"first"}
    commit(b, 0, changes({b"k": b"again"}), "attempt-3")
    reader.maintenance(now=FAR_FUTURE)
    assert not [p for p in (store / "manifests").iterdir() if p.name.startswith(".replaced-")]
    assert state_of(hdfs_like_backend(store, tmp_path / "r3", handler), 1) == {b"k": b"again"}


# -- defect 6 (worker side): a store busy with a stuck call answers, and names the call -------------


def store_json(store: Path, local: Path, instance: str, **options: str) -> str:
    return json.dumps(
        {
            "storeDir": f"file:{store}",
            "instanceId": instance,
            "operatorId": 0,
            "partitionId": 0,
            "storeName": "default",
            "keySchema": "k",
            "valueSchema": "v",
            "minVersionsToRetain": 10,
            "localDir": str(local),
            "viewsDir": str(local / "views"),
            "options": {"localRecoveryDir": str(local / "rec"), **options},
        }
    )


def start_stuck_commit(service: StoreService, handle: str, tmp_path: Path) -> tuple[threading.Event, threading.Thread]:
    """Starts a commit of version 1 that stops after its uploads until the returned event is set."""
    reached, release = hold_at(service._stores[handle].backend, "commit:uploaded")
    frame = tmp_path / "changes.arrow"
    frames.write_buffer(str(frame), _frame_bytes())
    (tmp_path / "l" / "views").mkdir(parents=True, exist_ok=True)
    view = str(tmp_path / "l" / "views" / "v1")
    stuck = threading.Thread(target=service.commit, args=(handle, 0, "", str(frame), "a", 1, 0, view), daemon=True)
    stuck.start()
    assert reached.wait(60), "the commit did not reach its uploads within 60 s"
    return release, stuck


def test_a_call_waiting_for_a_stuck_store_gives_up_and_names_the_holder(tmp_path: Path) -> None:
    service = StoreService()
    handle = json.loads(service.openStore(store_json(tmp_path / "s", tmp_path / "l", "i1", callTimeoutMs="1500")))[
        "handle"
    ]
    release, stuck = start_stuck_commit(service, handle, tmp_path)
    started = time.time()
    reply = json.loads(service.maintenance(handle))
    assert time.time() - started < 10
    assert "busy with commit of version 1" in reply["error"]["message"], reply
    release.set()
    stuck.join(30)


def _frame_bytes() -> pa.Buffer:
    sink = pa.BufferOutputStream()
    table = changes({b"k": b"v"})
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue()


def test_reopening_a_store_closes_the_backend_it_replaces(tmp_path: Path) -> None:
    service = StoreService()
    h1 = json.loads(service.openStore(store_json(tmp_path / "s", tmp_path / "l", "i1")))["handle"]
    old_work = service._stores[h1].backend.work_dir
    assert old_work.exists()
    h2 = json.loads(
        service.openStore(
            json.dumps({**json.loads(store_json(tmp_path / "s", tmp_path / "l", "i2")), "replacesHandle": h1})
        )
    )["handle"]
    assert h2 != h1 and h1 not in service._stores
    deadline = time.time() + 10
    while old_work.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert not old_work.exists(), "the replaced backend was not closed"
    # the same handle opened with other options also replaces (and closes) its backend
    work2 = service._stores[h2].backend.work_dir
    service.openStore(
        json.dumps(
            {**json.loads(store_json(tmp_path / "s", tmp_path / "l", "i2")), "options": {"transferThreads": "2"}}
        )
    )
    deadline = time.time() + 10
    while work2.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert not work2.exists()
    service.close_all()


def test_closing_a_store_busy_with_a_stuck_call_closes_it_when_the_call_returns(tmp_path: Path) -> None:
    service = StoreService()
    handle = json.loads(service.openStore(store_json(tmp_path / "s", tmp_path / "l", "i1")))["handle"]
    backend = service._stores[handle].backend
    release, stuck = start_stuck_commit(service, handle, tmp_path)
    reply = json.loads(service.closeStore(handle, wait_seconds=0.5))
    assert reply == {"closed": True, "deferred": True}, reply
    assert backend.work_dir.exists()  # still in use by the stuck commit
    release.set()
    stuck.join(30)
    deadline = time.time() + 10
    while backend.work_dir.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert not backend.work_dir.exists(), "the closed store's backend was never closed"


def test_close_all_closes_every_store(tmp_path: Path) -> None:
    service = StoreService()
    handles = [
        json.loads(service.openStore(store_json(tmp_path / f"s{i}", tmp_path / "l", f"i{i}")))["handle"]
        for i in range(3)
    ]
    works = [service._stores[h].backend.work_dir for h in handles]
    service.close_all()
    assert not any(w.exists() for w in works)


def test_a_bad_grace_is_refused_when_the_store_opens(tmp_path: Path) -> None:
    reply = json.loads(
        StoreService().openStore(store_json(tmp_path / "s", tmp_path / "l", "i", orphanGraceSeconds="1"))
    )
    assert "orphanGraceSeconds='1'" in reply["error"]["message"]
