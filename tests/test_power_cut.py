"""A power cut at every step of a store's history loses nothing a commit acknowledged (issues 66, 83).

The short form of `scripts/power_cut.py`: three small histories (changelog commits durable first,
with a maintenance snapshot and garbage collection of a chain; snapshot commits with SST snapshots;
compact-snapshot commits and changelog commits on them under checkpoint ids), each started in a
checkpoint whose directories Spark made unsynced, every event of each a cut point, each cut imaged
`lost`, `mixed` and `subset` (`power_cut.crash_image`) and, where garbage collection's manifest
removals are unsynced, in every order they could survive; every other image judged with Spark's
commit log a batch behind. A restart of each is itself cut (a power cut during the recovery from
one). Then each fsync the product makes is taken out in turn, and some cut must lose an
acknowledged version: an fsync none of these histories needs would be an unexplained cost, and one
the test cannot miss is one that guards something.
"""

from __future__ import annotations

import logging
import random
import shutil
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from power_cut import RecordingDisk, crash_image
from power_cut_history import SHORT, HistorySpec, check_cuts, check_restart_cuts, run_history, scratch_dir
from pystatestore.store import local_disk
from pystatestore.store.remote import RemoteStore

# Each history's fsync points: every one of them must be needed (a new one fails here until listed).
POINTS = {
    "changelog-durable-first": (
        "changelog:data",  # a version's changes stored in a file of their own
        "changelog:name",
        # a directory made for the first file of its kind (changelog/, snapshots/, ...), and those
        # from the checkpoint down to the store that Spark made and never synced
        "directory:name",
        "manifests:data",  # the commit point
        "manifests:name",
        "removals:name",  # each manifest garbage collection removes, before the next, and before files go
        "snapshots:data",  # a snapshot maintenance made, which garbage collection then relies on
        "snapshots:name",
    ),
    "snapshot-commits": (
        "directory:name",
        "manifests:data",
        "manifests:name",
        "private:data",  # a snapshot's files too large to be stored inside its manifest
        "private:name",
        "removals:name",
        "shared:data",  # a snapshot's SSTs
        "shared:name",
    ),
    "compact-commits-checkpoint-ids": (
        "changelog:data",  # a compact snapshot's segment once it is too big to sit in its manifest
        "changelog:name",
        "directory:name",
        "manifests:data",
        "manifests:name",
        "snapshots:data",
        "snapshots:name",
    ),
}


@pytest.fixture()
def disk_root() -> Iterator[Path]:
    """Where a history runs: in memory where the machine has it (thousands of restarts)."""
    root = scratch_dir("power-cut-test-")
    try:
        yield root / "disk"
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(autouse=True)
def quiet_restores(caplog: pytest.LogCaptureFixture) -> None:
    """Restores from damaged local copies log a warning each: thousands of lines, all expected."""
    caplog.set_level(logging.ERROR, logger="pystatestore")


@pytest.mark.parametrize("spec", SHORT, ids=lambda s: s.name)
def test_every_cut_restores_the_last_acknowledged_version(spec: HistorySpec, disk_root: Path) -> None:
    recording = run_history(spec, disk_root)
    assert sorted(recording.points) == sorted(POINTS[spec.name])
    # The recorder saw every write: with nothing lost, the image is what the disk holds.
    kept = crash_image(recording.events, len(recording.events), "kept")
    assert kept.tree == recording.final_tree
    # `kept` images are what a killed process leaves, which chaos and the model test cover; here the
    # power cut's own: nothing unsynced, a first part of it, or any part (scripts/power_cut.py runs
    # all four, with more draws).
    seed = zlib.crc32(spec.name.encode())
    report = check_cuts(recording, kinds=("lost", "mixed", "subset"), mixed_draws=1, seed=seed)
    print(f"{spec.name}: {len(recording.events)} events, {report.cuts} cuts, {report.images} distinct images")
    assert report.images > len(recording.events) // 3
    assert report.failures == []


@pytest.mark.parametrize("spec", SHORT, ids=lambda s: s.name)
def test_a_cut_during_the_restart_after_a_cut(spec: HistorySpec, disk_root: Path) -> None:
    """A double fault: the restart from one cut's image (a load, a commit and garbage collection
    of what the cut left) is cut at each of its events, and each image restarted and judged."""
    recording = run_history(spec, disk_root)
    report = check_restart_cuts(recording, first_cuts=3, seed=zlib.crc32(spec.name.encode()))
    print(f"{spec.name}: restarts cut {report.cuts} times, {report.images} distinct images")
    assert report.images > 3
    assert report.failures == []


@pytest.mark.parametrize(
    ("spec", "point"),
    [(spec, point) for spec in SHORT for point in POINTS[spec.name]],
    ids=lambda v: v.name if isinstance(v, HistorySpec) else v,
)
def test_each_fsync_is_needed(spec: HistorySpec, point: str, disk_root: Path) -> None:
    """Without the fsync at `point`, a power cut right after some reply or fsync loses what a reply
    acknowledged (or leaves a checkpoint `verify` or a restart refuses)."""
    recording = run_history(spec, disk_root, off=frozenset({point}))
    cuts = [i + 1 for i, e in enumerate(recording.events) if e.op in ("ack", "dirsync")] + [len(recording.events)]
    report = check_cuts(recording, cuts=cuts, kinds=("lost",), stop_at_first=True, behind=False, removals=False)
    assert report.failures, f"no cut after a reply or fsync lost anything without the fsync at {point}"


def test_the_images_follow_the_filesystems_rules(tmp_path: Path) -> None:
    """The simulator itself, on a hand-made log: unsynced data and names may vanish, synced ones
    stay, a rename is whole or not at all, a torn file keeps what was synced."""
    disk = RecordingDisk(tmp_path)
    (tmp_path / "d").mkdir()
    disk.mkdir(str(tmp_path / "x"))
    disk.write(str(tmp_path / "x" / "synced"), b"kept", "p:data")
    disk.sync_dir(str(tmp_path / "x"), "p:name")
    disk.sync_dir(str(tmp_path), "p:name")
    disk.write(str(tmp_path / "x" / "loose"), b"maybe", None)
    disk.write(str(tmp_path / "x" / ".tmp"), b"whole", "p:data")
    disk.replace(str(tmp_path / "x" / ".tmp"), str(tmp_path / "x" / "final"), "p:name")
    disk.write(str(tmp_path / "x" / "late"), b"after", None)
    lost = crash_image(disk.events, len(disk.events), "lost").tree
    # "loose" was named before the rename's directory fsync, which made its name durable, not its bytes.
    assert lost == {"x": None, "x/synced": b"kept", "x/loose": b"", "x/final": b"whole"}
    kept = crash_image(disk.events, len(disk.events), "kept").tree
    assert kept == {"x": None, "x/synced": b"kept", "x/loose": b"maybe", "x/final": b"whole", "x/late": b"after"}
    # Before the rename's directory fsync, the rename may or may not have happened, never in part.
    before_sync = next(i for i, e in enumerate(disk.events) if e.op == "rename") + 1
    trees = [crash_image(disk.events, before_sync, "mixed", random.Random(seed)).tree for seed in range(40)]
    for tree in trees:
        assert not ("x/final" in tree and "x/.tmp" in tree)
        assert tree.get("x/final", tree.get("x/.tmp", b"whole")) == b"whole"  # its data was synced before
        assert b"maybe".startswith(tree.get("x/loose", b""))  # gone, torn or whole
    assert any("x/final" in t for t in trees) and any("x/.tmp" in t for t in trees)
    assert {len(t.get("x/loose", b"")) for t in trees} >= {0, 5}


def test_history_steps_are_known(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown step"):
        run_history(HistorySpec("bad", "changelog", False, ("fly",)), tmp_path)


def test_the_images_keep_any_part_of_the_unsynced_names_and_start_from_a_base(tmp_path: Path) -> None:
    """`subset` images keep any of the unsynced names, not only a first part; a log that starts on
    a disk holding files (`base`) keeps them as they were, unless the log changed them."""
    base = {"x": None, "x/old": b"durable", "x/gone": b"also"}
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "old").write_bytes(b"durable")
    (tmp_path / "x" / "gone").write_bytes(b"also")
    disk = RecordingDisk(tmp_path, base=base)
    disk.write(str(tmp_path / "x" / "first"), b"1", "p:data")
    disk.write(str(tmp_path / "x" / "second"), b"2", "p:data")
    disk.unlink(str(tmp_path / "x" / "gone"))
    cut = len(disk.events)
    assert crash_image(disk.events, cut, "lost", base=base).tree == base
    trees = [crash_image(disk.events, cut, "subset", random.Random(seed), base=base).tree for seed in range(60)]
    assert any("x/second" in t and "x/first" not in t for t in trees)  # a later name without an earlier one
    assert any("x/gone" not in t and "x/first" not in t for t in trees)
    assert all(t["x/old"] == b"durable" for t in trees)
    mixed = [crash_image(disk.events, cut, "mixed", random.Random(seed), base=base).tree for seed in range(60)]
    assert not any("x/second" in t and "x/first" not in t for t in mixed)  # a journal keeps them in order
    disk.sync_dir(str(tmp_path / "x"), "p:name")
    assert crash_image(disk.events, len(disk.events), "lost", base=base).tree == {
        "x": None,
        "x/old": b"durable",
        "x/first": b"1",
        "x/second": b"2",
    }


def test_directories_spark_made_are_made_durable_once(disk_root: Path) -> None:
    """Spark makes the checkpoint's `state/<op>/` with no fsync: a store's first write syncs every
    directory from the checkpoint down (the checkpoint's own name included), once per process."""
    disk_root.mkdir(parents=True)
    disk = RecordingDisk(disk_root)
    disk.mkdirs_unsynced(disk_root / "ckpt" / "state" / "0")
    saved, local_disk.DISK = local_disk.DISK, disk
    try:
        store = RemoteStore(f"file:{disk_root}/ckpt/state/0/1")
        assert store.durable_root == f"{disk_root}/ckpt"
        store.publish("manifests/1.json", b"one")
        first = len(disk.events)
        store.publish("manifests/2.json", b"two")
        again = [e.path for e in disk.events[first:] if e.op == "dirsync"]
        RemoteStore(f"file:{disk_root}/ckpt/state/0/2/left-keyToNumValues").publish("manifests/1.json", b"x")
        other = [e.path for e in disk.events[first:] if e.op == "dirsync"][len(again) :]
    finally:
        local_disk.DISK = saved
    image = crash_image(disk.events, first, "lost").tree
    assert image.get("ckpt/state/0/1/manifests/1.json") == b"one"
    assert again == ["ckpt/state/0/1/manifests"]  # the second publish syncs only its own directory
    # Another store of the operator: its own directories, and state/0 for its name; not the rest again.
    assert other == ["ckpt/state/0", "ckpt/state/0/2", "ckpt/state/0/2/left-keyToNumValues"] + [
        "ckpt/state/0/2/left-keyToNumValues/manifests"
    ]


def test_the_directories_known_durable_are_bounded(disk_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Commits make an attempt directory each: the process remembers only the directories used
    last, and one it forgot is synced again (once), not trusted."""
    monkeypatch.setattr(local_disk, "DURABLE_NAMES_KEPT", 4)
    disk_root.mkdir(parents=True)
    disk = RecordingDisk(disk_root)

    def syncs_of(path: Path) -> int:
        before = len(disk.events)
        disk.make_dirs(str(path), "directory:name", root=str(disk_root))
        return sum(e.op == "dirsync" for e in disk.events[before:])

    assert syncs_of(disk_root / "a") == 1  # a's name (the root's own is synced outside the log)
    assert syncs_of(disk_root / "a") == 0
    for n in range(2):
        assert syncs_of(disk_root / f"attempt-{n}") == 1
    assert syncs_of(disk_root / "a") == 0  # still among the four used last (with the root)
    for n in range(2, 5):
        syncs_of(disk_root / f"attempt-{n}")
    assert syncs_of(disk_root / "a") == 1  # forgotten: its name synced again
