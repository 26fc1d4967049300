"""The fault matrix's damage to local copies stays on this host (scripts/chaoslib/local_damage.py,
decision 0048). A local copy's file may be a hard link of the checkpoint's file (a restore from a
checkpoint on the same filesystem links its SSTs, and a local copy links the local DB's): a byte
flipped in it must leave the checkpoint's file, and every other name of it, as they were. The
referee is the filesystem: bytes, mtimes and inode numbers."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from chaoslib.local_damage import damage_local_copies  # noqa: E402


def linked_layout(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    """A checkpoint SST, and the same file (hard links) in a local copy and the local DB, the
    local copy the only file under the local copies' directory. Returns (checkpoint file, local
    copies' directory, the copy's file, the local DB's file)."""
    checkpoint = tmp_path / "ckpt" / "state" / "0" / "1" / "shared" / "0f3a-000008.sst"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(random.Random(5).randbytes(64 << 10))
    local = tmp_path / "local"
    copy = local / "v1" / "store-key" / "3-0f3a" / "000008.sst"
    copy.parent.mkdir(parents=True)
    os.link(checkpoint, copy)
    db = tmp_path / "work" / "db-3" / "000008.sst"
    db.parent.mkdir(parents=True)
    os.link(checkpoint, db)
    return checkpoint, local, copy, db


def test_a_flipped_byte_in_a_linked_local_copy_stays_in_the_copy(tmp_path: Path) -> None:
    checkpoint, local, copy, db = linked_layout(tmp_path)
    before, mtime = checkpoint.read_bytes(), checkpoint.stat().st_mtime_ns
    assert copy.stat().st_ino == checkpoint.stat().st_ino and checkpoint.stat().st_nlink == 3
    note = damage_local_copies(local, "flip", random.Random(1))
    assert note == f"flip {copy.relative_to(local)}"
    damaged = copy.read_bytes()
    assert len(damaged) == len(before)
    assert sum(a != b for a, b in zip(damaged, before, strict=True)) == 1, "the copy holds one flipped byte"
    assert checkpoint.read_bytes() == before and checkpoint.stat().st_mtime_ns == mtime, "the checkpoint changed"
    assert db.read_bytes() == before, "the local DB's name of the file changed"
    assert copy.stat().st_ino != checkpoint.stat().st_ino and checkpoint.stat().st_nlink == 2
    assert sorted(p.name for p in copy.parent.iterdir()) == [copy.name], "a temporary was left beside the copy"


def test_a_deleted_local_copy_file_leaves_the_checkpoint_whole(tmp_path: Path) -> None:
    checkpoint, local, copy, _ = linked_layout(tmp_path)
    before = checkpoint.read_bytes()
    damage_local_copies(local, "delete", random.Random(1))
    assert not copy.exists() and checkpoint.read_bytes() == before


def test_the_damage_draws_what_it_drew_before(tmp_path: Path) -> None:
    """A seed replays its run: the damage takes the same two draws from the run's generator (the
    file, the byte) as the in-place flip did, so the draws after it are the same too."""
    _, local, copy, _ = linked_layout(tmp_path)
    before = copy.read_bytes()
    rnd, replay = random.Random(9), random.Random(9)
    damage_local_copies(local, "flip", rnd)
    replay.choice([copy])
    at = replay.randrange(len(before))
    assert copy.read_bytes()[at] == before[at] ^ 0x5A
    assert rnd.random() == replay.random()
