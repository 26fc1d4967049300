"""A restore on a host with nothing local (issue 67): a snapshot's SSTs hard-linked from a checkpoint
on the same filesystem (and copied from one that is not), checked byte for byte either way; the
changes after it downloaded in parallel and replayed as each arrives. The referees are the
filesystem (inode numbers, the checkpoint's bytes) and the input."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from backend_support import changes, commit, make_backend, state_of
from pystatestore.store.errors import CheckpointDamagedError, CheckpointMissingError

FRESH = {"localRecovery": "false"}


def pairs(n: int, start: int, tag: bytes) -> dict[bytes, bytes]:
    return {b"k%08d" % (start + i): tag + b"%08d" % (start + i) for i in range(n)}


def snapshot_store(store: Path, local: Path) -> dict[bytes, bytes]:
    """A changelog store whose version 2 has a maintenance snapshot of SST files (not compact); its state."""
    b = make_backend("rocksdb", store, local, mode="changelog", options={"compactSnapshotMaxBytes": "0", **FRESH})
    expected: dict[bytes, bytes] = {}
    for v in (1, 2):
        puts = pairs(20_000, (v - 1) * 20_000, b"v%d-" % v)
        commit(b, v - 1, changes(puts), f"a{v}", num_keys=len(expected) + len(puts))
        expected.update(puts)
    job = b.prepare_materialization(force=True)
    assert job is not None
    b.finish_materialization(job)
    b.complete_materialization(job)
    b.close()
    return expected


def restored_ssts(local: Path) -> list[Path]:
    return [p for p in local.rglob("*.sst") if "views" not in p.parts]


def test_snapshot_ssts_are_hard_links_of_a_checkpoint_on_the_same_disk(tmp_path: Path) -> None:
    store = tmp_path / "store"
    expected = snapshot_store(store, tmp_path / "writer")
    b = make_backend("rocksdb", store, tmp_path / "new-host", mode="changelog", options=FRESH)
    assert state_of(b, 2) == expected
    checkpoint_inodes = {p.stat().st_ino for p in (store / "shared").rglob("*.sst")}
    local = restored_ssts(tmp_path / "new-host")
    assert local and checkpoint_inodes
    assert {p.stat().st_ino for p in local} <= checkpoint_inodes, "the restore copied SSTs it could link"


@pytest.mark.skipif(not os.access("/dev/shm", os.W_OK), reason="needs a second filesystem (/dev/shm)")
def test_a_checkpoint_on_another_filesystem_is_copied(tmp_path: Path) -> None:
    import tempfile

    other = Path(tempfile.mkdtemp(prefix="pss-other-fs-", dir="/dev/shm"))
    try:
        if os.stat(other).st_dev == os.stat(tmp_path).st_dev:
            pytest.skip("/dev/shm is on the same filesystem here")
        store = other / "store"
        expected = snapshot_store(store, tmp_path / "writer")
        b = make_backend("rocksdb", store, tmp_path / "new-host", mode="changelog", options=FRESH)
        assert state_of(b, 2) == expected
        checkpoint_inodes = {p.stat().st_ino for p in (store / "shared").rglob("*.sst")}
        assert not {p.stat().st_ino for p in restored_ssts(tmp_path / "new-host")} & checkpoint_inodes
    finally:
        import shutil

        shutil.rmtree(other, ignore_errors=True)


def test_a_tampered_sst_is_refused_and_left_as_it_is(tmp_path: Path) -> None:
    """Linking skips the copy, not the check: a flipped byte fails the restore naming the file,
    and the checkpoint's file keeps its bytes (nothing of the restore writes through the link)."""
    store = tmp_path / "store"
    snapshot_store(store, tmp_path / "writer")
    victim = max((store / "shared").rglob("*.sst"), key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    b = make_backend("rocksdb", store, tmp_path / "new-host", mode="changelog", options=FRESH)
    with pytest.raises(CheckpointDamagedError) as e:
        b.load(2, str(tmp_path / "new-host" / "views" / "v2"))
    assert victim.name in str(e.value)
    assert victim.read_bytes() == bytes(data)
    assert not restored_ssts(tmp_path / "new-host")


def changelog_store(store: Path, local: Path, versions: int) -> dict[bytes, bytes]:
    """Versions 1..`versions`, each with its changes in a file of its own; no snapshot."""
    b = make_backend(
        "rocksdb",
        store,
        local,
        mode="changelog",
        options={"inlineThresholdBytes": "0", "snapshotChangesFraction": "0", **FRESH},
    )
    expected: dict[bytes, bytes] = {}
    for v in range(1, versions + 1):
        puts = pairs(2_000, v * 1_000, b"v%d-" % v)  # half of each version overwrites the one before
        expected.update(puts)
        commit(b, v - 1, changes(puts), f"a{v}", num_keys=len(expected))
    b.close()
    return expected


def test_changes_after_the_snapshot_download_in_parallel(tmp_path: Path) -> None:
    """The first segment's download is held until another one has arrived: a restore that fetched
    the segments one after another would wait out the hold; this one replays them all."""
    store = tmp_path / "store"
    expected = changelog_store(store, tmp_path / "writer", 4)
    b = make_backend("rocksdb", store, tmp_path / "new-host", mode="changelog", options=FRESH)
    another_arrived, held = threading.Event(), []
    files_done = [0]
    lock = threading.Lock()

    def hook(point: str) -> None:
        if point == "download:chunk":
            with lock:
                first = not held
                held.append(threading.get_ident())
            if first:
                held.append(another_arrived.wait(10))
        elif point == "download:file":
            with lock:
                files_done[0] += 1
            another_arrived.set()

    b.fault_hook = hook
    result = b.load(4, str(tmp_path / "new-host" / "views" / "v4"))
    assert True in held[1:], "no other segment arrived while the first one's download was held"
    assert result.metrics["restoreChangelogVersions"] == 4 and result.metrics["restoreRemoteFiles"] == 4
    b.fault_hook = None
    assert state_of(b, 4) == expected


def test_a_missing_segment_names_its_file_and_leaves_nothing(tmp_path: Path) -> None:
    store = tmp_path / "store"
    changelog_store(store, tmp_path / "writer", 4)
    gone = sorted((store / "changelog").glob("3-*"))
    assert len(gone) == 1
    gone[0].unlink()
    work = tmp_path / "new-host"
    b = make_backend("rocksdb", store, work, mode="changelog", options=FRESH)
    with pytest.raises(CheckpointMissingError) as e:
        b.load(4, str(work / "views" / "v4"))
    assert gone[0].name in str(e.value)
    leftovers = [p for p in work.rglob("*") if p.is_file() and "views" not in p.parts and "recovery" not in p.parts]
    assert not [p for p in leftovers if p.name.startswith("segment-")], leftovers
