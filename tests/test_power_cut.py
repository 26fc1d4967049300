"""A power cut at every step of a store's history loses nothing a commit acknowledged (issue 66).

The short form of `scripts/power_cut.py`: two small histories (changelog commits durable first,
with a maintenance snapshot and garbage collection; snapshot commits with SST snapshots), every
event of each a cut point, each cut imaged three ways (`power_cut.crash_image`). Then each fsync
the product makes is taken out in turn, and some cut must lose an acknowledged version: an fsync
none of these histories needs would be an unexplained cost, and one the test cannot miss is one
that guards something.
"""

from __future__ import annotations

import logging
import random
import zlib
from pathlib import Path

import pytest

from power_cut import RecordingDisk, crash_image
from power_cut_history import SHORT, HistorySpec, check_cuts, run_history

# Each history's fsync points: every one of them must be needed (a new one fails here until listed).
POINTS = {
    "changelog-durable-first": (
        "changelog:data",  # a version's changes stored in a file of their own
        "changelog:name",
        "directory:name",  # a directory made for the first file of its kind (changelog/, snapshots/, ...)
        "manifests:data",  # the commit point
        "manifests:name",
        "removals:name",  # garbage collection's removed manifests, before the files they named go
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
}


@pytest.fixture(autouse=True)
def quiet_restores(caplog: pytest.LogCaptureFixture) -> None:
    """Restores from damaged local copies log a warning each: thousands of lines, all expected."""
    caplog.set_level(logging.ERROR, logger="pystatestore")


@pytest.mark.parametrize("spec", SHORT, ids=lambda s: s.name)
def test_every_cut_restores_the_last_acknowledged_version(spec: HistorySpec, tmp_path: Path) -> None:
    recording = run_history(spec, tmp_path / "disk")
    assert sorted(recording.points) == sorted(POINTS[spec.name])
    # The recorder saw every write: with nothing lost, the image is what the disk holds.
    kept = crash_image(recording.events, len(recording.events), "kept")
    assert kept.tree == recording.final_tree
    # `kept` images are what a killed process leaves, which chaos and the model test cover; here the
    # power cut's own: nothing unsynced, or a first part of it (scripts/power_cut.py runs all three).
    report = check_cuts(recording, kinds=("lost", "mixed"), mixed_draws=1, seed=zlib.crc32(spec.name.encode()))
    print(f"{spec.name}: {len(recording.events)} events, {report.cuts} cuts, {report.images} distinct images")
    assert report.images > len(recording.events) // 3
    assert report.failures == []


@pytest.mark.parametrize(
    ("spec", "point"),
    [(spec, point) for spec in SHORT for point in POINTS[spec.name]],
    ids=lambda v: v.name if isinstance(v, HistorySpec) else v,
)
def test_each_fsync_is_needed(spec: HistorySpec, point: str, tmp_path: Path) -> None:
    """Without the fsync at `point`, a power cut right after some reply or fsync loses what a reply
    acknowledged (or leaves a checkpoint `verify` or a restart refuses)."""
    recording = run_history(spec, tmp_path / "disk", off=frozenset({point}))
    cuts = [i + 1 for i, e in enumerate(recording.events) if e.op in ("ack", "dirsync")] + [len(recording.events)]
    report = check_cuts(recording, cuts=cuts, kinds=("lost",), stop_at_first=True)
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
