"""Hard-linked restores (issue 83, decision 0048): a restore from a checkpoint on the same filesystem
hard-links the snapshot's SSTs, local copies and views link them again, and the queryable service's
restores link them into its scratch space, so a write in place to any of those files would be a
write into the checkpoint. A real history, without Spark, on one filesystem: a restore on a new
host, commits with a local copy of every version, the queryable service following the store,
snapshots, a compaction, garbage collection past the grace, local copies pruned, and a restart on
the same host from its local copies. Two referees, neither from the product: the kernel reports
every open for writing of every checkpoint file's inode under any name (tests/write_watch.py,
inotify), and every checkpoint file keeps the bytes and mtime it had when first seen (GC may
delete one, never change it). Each history first shows that links happened (shared inodes)."""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from backend_support import MODES, changes, commit, make_backend, materialize_if_due, state_of
from pystatestore.queryable.versions import StoreFollower
from pystatestore.reading.checkpoint import StoreLocation
from write_watch import AVAILABLE, WriteWatch

pytestmark = pytest.mark.skipif(not AVAILABLE, reason="inotify is Linux's")

RETAIN = 2
KEYS_PER_VERSION = 4000
HOST_OPTIONS = {
    "compactSnapshotMaxBytes": "0",  # snapshots of SST files, which is what a restore links
    "inlineThresholdBytes": "0",  # every file of a snapshot in a file of its own, none inside its manifest
    "localRecoveryInterval": "1",  # a local copy of every version: links of the local DB's files
    "localRecoveryVersions": "2",  # older copies pruned as new ones come
    "rocksdb.l0CompactionTrigger": "2",
}


@dataclass(frozen=True)
class Seen:
    inode: tuple[int, int]
    sha256: str
    mtime_ns: int


def seen_now(path: Path) -> Seen:
    st = path.stat()
    return Seen((st.st_dev, st.st_ino), hashlib.sha256(path.read_bytes()).hexdigest(), st.st_mtime_ns)


class CheckpointLedger:
    """Every file of the checkpoint as first seen (bytes and mtime), each watched from then on."""

    def __init__(self, store: Path) -> None:
        self.store = store
        self.seen: dict[Path, Seen] = {}
        self.watch = WriteWatch()

    def files(self) -> list[Path]:
        # A dot-named file is a publication in the making (written, then renamed into place): its
        # final name is recorded once it has one.
        return sorted(p for p in self.store.rglob("*") if p.is_file() and not p.name.startswith("."))

    def record(self) -> None:
        """Watches and records the files not seen before (the history's calls have returned: every
        file present is whole)."""
        for path in self.files():
            if path in self.seen and self.seen[path].inode == inode(path):
                continue
            # New, or a new file renamed over the name (a publication replaces, never rewrites).
            if self.watch.watch(path):
                self.seen[path] = seen_now(path)

    def inodes(self) -> dict[tuple[int, int], Path]:
        """The checkpoint's files present now, by inode."""
        out = {}
        for path in self.files():
            st = path.stat()
            out[(st.st_dev, st.st_ino)] = path
        return out

    def linked_from(self, local: Path) -> dict[Path, Path]:
        """Each file under `local` that is a hard link of a checkpoint file -> that file."""
        ours = self.inodes()
        out = {}
        for path in local.rglob("*"):
            if path.is_file() and not path.is_symlink():
                st = path.stat()
                if (st.st_dev, st.st_ino) in ours:
                    assert st.st_nlink > 1
                    out[path] = ours[(st.st_dev, st.st_ino)]
        return out

    def changed(self) -> list[str]:
        """Files seen and still present (the same inode under the same name) whose bytes or mtime
        are not what they were."""
        out = []
        for path, before in self.seen.items():
            try:
                now = seen_now(path)
            except FileNotFoundError:
                continue  # deleted by GC: allowed
            if now.inode != before.inode:
                continue  # another file renamed over the name since: the one seen was not written
            if now != before:
                what = "bytes" if now.sha256 != before.sha256 else "mtime"
                out.append(f"{path.relative_to(self.store)} ({what} changed)")
        return out


def inode(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_dev, st.st_ino


def pairs(n: int, start: int, tag: bytes) -> dict[bytes, bytes]:
    return {b"k%08d" % (start + i): tag + b"%08d" % (start + i) for i in range(n)}


def write_checkpoint(store: Path, writer: Path, mode: str) -> dict[bytes, bytes]:
    """Versions 1 and 2 written on another host; version 2 has a snapshot of SST files."""
    b = make_backend(
        "rocksdb", store, writer, retain=RETAIN, mode=mode, options={**HOST_OPTIONS, "localRecovery": "false"}
    )
    state: dict[bytes, bytes] = {}
    for v in (1, 2):
        puts = pairs(KEYS_PER_VERSION, (v - 1) * KEYS_PER_VERSION, b"w%d-" % v)
        state.update(puts)
        commit(b, v - 1, changes(puts), f"w{v}", b.db.manifest_id if v > 1 else None, num_keys=len(state))
    if mode == "changelog":
        job = b.prepare_materialization(force=True)
        assert job is not None
        b.finish_materialization(job)
        b.complete_materialization(job)
    b.close()
    return state


def next_changes(v: int, state: dict[bytes, bytes]) -> tuple[dict[bytes, bytes], list[bytes]]:
    """Overwrites a stretch of the restored keys (so compaction has linked SSTs to rewrite), adds
    new ones and deletes a few."""
    puts = pairs(KEYS_PER_VERSION // 2, (v * 1500) % (2 * KEYS_PER_VERSION), b"h%d-" % v)
    deletes = [k for k in sorted(state)[v::97] if k not in puts][:20]
    return puts, deletes


def host_backend(store: Path, host: Path, mode: str):  # noqa: ANN201
    return make_backend("rocksdb", store, host, retain=RETAIN, min_deltas=3, mode=mode, options=HOST_OPTIONS)


def run_history(tmp_path: Path, mode: str, ledger: CheckpointLedger, store: Path, state: dict[bytes, bytes]) -> None:
    """The history on the new host, checking along the way that the links it is about happen."""
    host, scratch = tmp_path / "host", tmp_path / "scratch"
    scratch.mkdir()
    b = host_backend(store, host, mode)
    assert state_of(b, 2) == state
    restored = ledger.linked_from(host / "rocksdb")
    assert any(p.suffix == ".sst" for p in restored), "the restore copied SSTs it could link"
    assert all(p.suffix == ".sst" for p in restored), f"a restore linked more than SSTs: {sorted(restored)}"
    restored_inodes = {inode(p) for p in restored}

    follower = StoreFollower(StoreLocation(0, 1, "default", f"file:{store}"), str(scratch))
    served = follower.open(2)
    assert ledger.linked_from(scratch), "the queryable service's restore copied SSTs it could link"

    version, copies_linked, gc_deleted = 2, False, 0
    for step in range(7):
        if step == 4:  # a restart on this host: restored from its local copies, linked again
            b.close()
            b = host_backend(store, host, mode)
            result = b.load(version)
            assert result.source == "local-copy" and result.metrics["restoreRemoteFiles"] == 0
            # RocksDB appends to the WAL it recovers and rocksdict rewrites its sidecar file on
            # every open: the restored DB's own copies, never links of the copy's files.
            shared = [p.name for p in b.db.dir.iterdir() if p.stat().st_nlink > 1]
            assert shared and all(name.endswith(".sst") for name in shared), shared
        puts, deletes = next_changes(version, state)
        state.update(puts)
        for k in deletes:
            state.pop(k, None)
        commit(b, version, changes(puts, deletes), f"h{version + 1}", b.db.manifest_id, num_keys=len(state))
        version += 1
        copies_linked = copies_linked or bool(ledger.linked_from(host / "recovery"))
        ledger.record()
        materialize_if_due(b)
        ledger.record()
        if step == 2:
            # A compaction of the whole DB now (universal compaction may have run some already, in
            # its own time): every SST rewritten, the restored ones deleted from the local DB.
            b.db.db.compact_range(None, None)
            assert not {inode(p) for p in b.db.dir.glob("*.sst")} & restored_inodes, "no compaction rewrote them"
        assert not ledger.changed(), f"checkpoint files changed by step {step}: {ledger.changed()}"
        report = b.maintenance(now=time.time() + 3600)  # past the grace: GC deletes what is unneeded
        gc_deleted += report["deletedFiles"]
        ledger.record()
        served.release()
        served = follower.open(version)
        assert dict(served.items()) == state
    served.release()
    follower.close()
    assert state_of(b, version) == state
    b.close()
    assert copies_linked, "no local copy shared a file with the checkpoint"
    assert gc_deleted, "GC deleted nothing: the history never collected a linked file's name"
    recovery = host / "recovery"
    kept = {p.parent.name for p in recovery.rglob(".pystatestore-copy.json")}
    assert len(kept) == 2, f"local copies not pruned to 2: {sorted(kept)}"


@pytest.mark.parametrize("mode", MODES)
def test_nothing_writes_into_a_linked_checkpoint_file(tmp_path: Path, mode: str) -> None:
    store = tmp_path / "store"
    state = write_checkpoint(store, tmp_path / "writer", mode)
    ledger = CheckpointLedger(store)
    ledger.record()  # the moment of the restore
    at_restore = dict(ledger.seen)
    try:
        run_history(tmp_path, mode, ledger, store, state)
        writes = ledger.watch.writes()
    finally:
        ledger.watch.close()
    assert not ledger.watch.overflowed
    assert not writes, "checkpoint files opened for writing after they were made: " + ", ".join(
        f"{w.path.relative_to(store)} {w.what}" for w in writes
    )
    assert not ledger.changed(), f"checkpoint files changed: {ledger.changed()}"
    assert [p for p in at_restore if not p.exists()], "GC deleted none of the files the restore linked"
    assert [p for p in ledger.seen if p.exists()], "nothing left to check"
    assert os.stat(store).st_dev == os.stat(tmp_path / "host").st_dev
