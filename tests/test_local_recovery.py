"""Local recovery copies (DESIGN §5) at the backend level: restore from this host's copies, fall
back to the checkpoint file by file, never fail a commit over a copy."""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import time
from pathlib import Path

import pytest

from backend_support import MODES, changes, commit, make_backend, materialize_if_due, state_of
from local_recovery_support import damage_one_sst_in_place
from pystatestore.store.errors import StoreConfigError
from pystatestore.store.kept_changes import CHANGES_MARKER
from pystatestore.store.local_recovery import MARKER, clean_stale_stores

BIG = {f"k{i:05d}".encode(): b"v" * 64 for i in range(3000)}


def commit_versions(
    store_dir: Path,
    local: Path,
    recovery: Path,
    n: int = 3,
    keep: int = 2,
    mode: str | None = None,
    interval: int = 1,
) -> dict[bytes, bytes]:
    b = make_backend(
        "rocksdb",
        store_dir,
        local,
        options={
            "localRecoveryDir": str(recovery),
            "localRecoveryVersions": str(keep),
            "localRecoveryInterval": str(interval),
        },
        mode=mode,
    )
    state = dict(BIG)
    commit(b, 0, changes(BIG), "t1")
    for v in range(2, n + 1):
        puts = {f"n{v}".encode(): str(v).encode()}
        commit(b, v - 1, changes(puts), f"t{v}")
        state.update(puts)
    b.close()  # the worker (or executor) goes away; the copies stay on the host
    return state


def restore(store_dir: Path, local: Path, recovery: Path, version: int):  # noqa: ANN201
    b = make_backend("rocksdb", store_dir, local, options={"localRecoveryDir": str(recovery)})
    result = b.load(version)
    return b, result


@pytest.mark.parametrize("mode", MODES)
def test_restore_from_intact_local_copy_downloads_nothing(tmp_path: Path, mode: str) -> None:
    expected = commit_versions(tmp_path / "store", tmp_path / "w1", tmp_path / "rec", mode=mode)
    b, result = restore(tmp_path / "store", tmp_path / "w2", tmp_path / "rec", 3)
    assert result.metrics["restoreRemoteFiles"] == 0 and result.metrics["restoreRemoteBytes"] == 0
    assert result.metrics["restoreLocalFiles"] > 0 and result.source == "local-copy"
    assert state_of(b, 3) == expected


def test_damaged_sst_in_local_copy_is_fetched_alone_and_named(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A snapshot version's copy is checked file by file against its manifest."""
    expected = commit_versions(tmp_path / "store", tmp_path / "w1", tmp_path / "rec", mode="snapshot")
    sst = damage_one_sst_in_place(tmp_path / "rec")
    with caplog.at_level(logging.WARNING, logger="pystatestore.store.local_recovery"):
        b, result = restore(tmp_path / "store", tmp_path / "w2", tmp_path / "rec", 3)
    assert result.metrics["restoreRemoteFiles"] == 1
    assert result.metrics["restoreLocalFiles"] > 0
    assert any(str(sst) in r.getMessage() for r in caplog.records), caplog.text
    assert state_of(b, 3) == expected


def test_a_damaged_copy_of_a_changelog_version_is_not_used(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A changelog version's manifest lists no files: its copy is checked as a whole against the
    sizes and checksums its marker recorded, and a damaged one is passed over (the SST is shared
    by every copy through hard links, so here the state comes from the checkpoint's changes)."""
    expected = commit_versions(tmp_path / "store", tmp_path / "w1", tmp_path / "rec", mode="changelog")
    sst = damage_one_sst_in_place(tmp_path / "rec")
    with caplog.at_level(logging.WARNING, logger="pystatestore.store.local_recovery"):
        b, result = restore(tmp_path / "store", tmp_path / "w2", tmp_path / "rec", 3)
    assert result.metrics["restoreLocalFiles"] == 0 and result.metrics["restoreChangelogVersions"] == 3
    assert any(sst.name in r.getMessage() and "damaged" in r.getMessage() for r in caplog.records), caplog.text
    assert state_of(b, 3) == expected


@pytest.mark.parametrize("mode", MODES)
def test_unwritable_recovery_dir_never_fails_a_commit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, mode: str
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the recovery dir should be")
    with caplog.at_level(logging.WARNING, logger="pystatestore.store.local_recovery"):
        expected = commit_versions(tmp_path / "store", tmp_path / "w1", blocker / "rec", mode=mode)
    assert sum("local recovery copies disabled" in r.getMessage() for r in caplog.records) == 1  # warned once
    b, result = restore(tmp_path / "store", tmp_path / "w2", blocker / "rec", 3)
    assert result.metrics["restoreLocalFiles"] == 0
    if mode == "snapshot":
        assert result.metrics["restoreRemoteFiles"] > 0
    else:  # the changes of versions 1 to 3, from inside their manifests
        assert result.metrics["restoreChangelogVersions"] == 3
    assert state_of(b, 3) == expected


def test_only_the_newest_copies_are_kept(tmp_path: Path) -> None:
    commit_versions(tmp_path / "store", tmp_path / "w1", tmp_path / "rec", n=6, keep=2)
    copies = sorted(int(m.parent.name.split("-")[0]) for m in (tmp_path / "rec").rglob(MARKER))
    assert copies == [5, 6]


def test_changelog_commits_keep_a_copy_every_interval_and_restores_replay_the_rest(tmp_path: Path) -> None:
    """With changelog commits a copy is kept every `localRecoveryInterval` versions, staggered by
    partition (the test backend is partition 1: versions 3 and 7 here); a restore starts from the
    newest copy on the chain and replays the changes after it, downloading nothing."""
    expected = commit_versions(tmp_path / "store", tmp_path / "w1", tmp_path / "rec", n=9, mode="changelog", interval=4)
    copies = sorted(int(m.parent.name.split("-")[0]) for m in (tmp_path / "rec").rglob(MARKER))
    assert copies == [3, 7]
    b, result = restore(tmp_path / "store", tmp_path / "w2", tmp_path / "rec", 9)
    assert result.source == "local-copy" and result.metrics["restoreLocalFiles"] > 0
    assert result.metrics["restoreChangelogVersions"] == 2 and result.metrics["restoreRemoteFiles"] == 0
    assert state_of(b, 9) == expected


def test_changelog_commits_of_many_rows_keep_a_copy_whatever_the_interval(tmp_path: Path) -> None:
    """A restore replays every version after its copy: once the versions since the last copy hold
    100,000 rows (one bulk commit, or two of 60,000), the commit keeps a copy, so a restart after a
    backlog does not replay it (partition 1, interval 4: version 3 keeps one by the interval)."""
    b = make_backend(
        "rocksdb",
        tmp_path / "store",
        tmp_path / "w1",
        options={
            "localRecoveryDir": str(tmp_path / "rec"),
            "localRecoveryVersions": "10",
            "localRecoveryInterval": "4",
        },
        mode="changelog",
    )
    sizes = {1: 60_000, 2: 60_000, 3: 1, 4: 120_000, 5: 1, 6: 50_000}  # a copy starts the count again
    state: dict[bytes, bytes] = {}
    for version, rows in sizes.items():
        puts = {f"v{version}-{i:06d}".encode(): b"x" for i in range(rows)}
        commit(b, version - 1, changes(puts), f"t{version}")
        state.update(puts)
    b.close()
    copies = sorted(int(m.parent.name.split("-")[0]) for m in (tmp_path / "rec").rglob(MARKER))
    assert copies == [2, 3, 4]
    restored, result = restore(tmp_path / "store", tmp_path / "w2", tmp_path / "rec", 6)
    assert result.source == "local-copy" and result.metrics["restoreChangelogVersions"] == 2
    assert state_of(restored, 6) == state


def test_snapshot_commits_keep_a_copy_of_every_version(tmp_path: Path) -> None:
    commit_versions(tmp_path / "store", tmp_path / "w1", tmp_path / "rec", n=4, keep=4, mode="snapshot", interval=4)
    copies = sorted(int(m.parent.name.split("-")[0]) for m in (tmp_path / "rec").rglob(MARKER))
    assert copies == [1, 2, 3, 4]


@pytest.mark.parametrize("option", ["localRecoveryInterval", "localRecoveryVersions"])
@pytest.mark.parametrize("raw", ["0", "-2", "four", ""])
def test_a_bad_local_recovery_count_is_refused_naming_the_conf(tmp_path: Path, option: str, raw: str) -> None:
    with pytest.raises(StoreConfigError) as e:
        make_backend("rocksdb", tmp_path / "store", tmp_path / "w", options={option: raw})
    msg = str(e.value)
    assert f"spark.sql.streaming.stateStore.pystatestore.{option}" in msg and str(tmp_path / "store") in msg, msg
    assert not (tmp_path / "store").exists() or not any((tmp_path / "store").rglob("*"))


@pytest.mark.parametrize("mode", MODES)
def test_copies_of_a_superseded_attempt_are_dropped(tmp_path: Path, mode: str) -> None:
    store, rec = tmp_path / "store", tmp_path / "rec"
    every = {"localRecoveryDir": str(rec), "localRecoveryInterval": "1"}  # a copy of each version
    a = make_backend("rocksdb", store, tmp_path / "a", options=every, mode=mode)
    commit(a, 0, changes({b"x": b"1"}), "t1")
    commit(a, 1, changes({b"x": b"from-a"}), "attempt-a")
    b = make_backend("rocksdb", store, tmp_path / "b", options=every, mode=mode)
    commit(b, 1, changes({b"x": b"from-b"}), "attempt-b")  # b's manifest for version 2 wins
    winner = json.loads((store / "manifests" / "2.json").read_text())["manifest_id"]
    c, _ = restore(store, tmp_path / "c", rec, 2)
    ids = {m.parent.name.split("-", 1)[1] for m in rec.rglob(MARKER) if m.parent.name.startswith("2-")}
    assert ids == {winner}
    assert state_of(c, 2) == {b"x": b"from-b"}


def test_stale_store_cleanup_touches_only_our_layout(tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    commit_versions(tmp_path / "gone-store", tmp_path / "w1", rec)
    stranger = rec / "v1" / "not-ours"
    stranger.mkdir(parents=True)
    (stranger / "data").write_text("keep")
    removed = clean_stale_stores(rec, lambda store: False, older_than_s=0)
    assert removed == 1
    assert (stranger / "data").read_text() == "keep"
    assert not list(rec.rglob(MARKER))


def test_maintenance_removes_copies_of_stores_that_are_gone(tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    commit_versions(tmp_path / "gone-store", tmp_path / "w1", rec)
    for store_dir in (tmp_path / "gone-store",):
        shutil.rmtree(store_dir)  # the query's checkpoint was deleted
    for marker in [*rec.rglob(MARKER), *rec.rglob(CHANGES_MARKER)]:  # the store's copies and kept changes
        os.utime(marker, (time.time() - 7200, time.time() - 7200))
    live = make_backend(
        "rocksdb",
        tmp_path / "live-store",
        tmp_path / "w2",
        options={"localRecoveryDir": str(rec), "localRecoveryInterval": "1"},
    )
    commit(live, 0, changes({b"a": b"1"}), "t")
    report = live.maintenance()
    assert report["staleLocalStoresRemoved"] == 1
    stores = {json.loads(m.read_text())["store"] for m in rec.rglob(MARKER)}
    assert stores == {f"file:{tmp_path / 'live-store'}"}


def test_copies_are_owner_only(tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    commit_versions(tmp_path / "store", tmp_path / "w1", rec, n=2)
    dirs = [rec, rec / "v1", *[m.parent for m in rec.rglob(MARKER)], *[m.parent.parent for m in rec.rglob(MARKER)]]
    assert all(stat.S_IMODE(d.stat().st_mode) == 0o700 for d in dirs), {str(d): oct(d.stat().st_mode) for d in dirs}


def test_a_recovery_dir_made_world_writable_is_tightened(tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    rec.mkdir(mode=0o777)
    os.chmod(rec, 0o777)
    commit_versions(tmp_path / "store", tmp_path / "w1", rec, n=1)
    assert stat.S_IMODE(rec.stat().st_mode) == 0o700


@pytest.mark.skipif(os.getuid() != 0, reason="needs to hand a directory to another user")
def test_a_recovery_dir_of_another_user_is_never_used(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rec = tmp_path / "rec"
    expected = commit_versions(tmp_path / "store", tmp_path / "w1", rec)
    os.chown(rec, 65534, 65534)  # now it belongs to "nobody", who could have planted files
    with caplog.at_level(logging.WARNING, logger="pystatestore.store.local_recovery"):
        b, result = restore(tmp_path / "store", tmp_path / "w2", rec, 3)
    assert result.metrics["restoreLocalFiles"] == 0, "a copy in someone else's directory was trusted"
    assert any("belongs to uid 65534" in r.getMessage() for r in caplog.records), caplog.text
    assert state_of(b, 3) == expected


def test_a_symlinked_recovery_dir_is_never_used(tmp_path: Path) -> None:
    real = tmp_path / "elsewhere"
    expected = commit_versions(tmp_path / "store", tmp_path / "w1", real)
    link = tmp_path / "rec-link"
    os.symlink(real, link)
    b, result = restore(tmp_path / "store", tmp_path / "w2", link, 3)
    assert result.metrics["restoreLocalFiles"] == 0
    assert state_of(b, 3) == expected


def test_a_copy_that_lost_a_file_its_marker_never_listed_is_dropped_not_fatal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A copy pruned by another instance while it was saved can lose files before its marker is
    written, so the marker vouches for what is left: a restore must fall back to the checkpoint
    (and not fail every retry on this host the same way)."""
    store, rec = tmp_path / "store", tmp_path / "rec"
    expected = commit_versions(store, tmp_path / "w1", rec, n=3)
    marker_path = max(rec.rglob(MARKER), key=lambda m: int(m.parent.name.split("-")[0]))
    marker = json.loads(marker_path.read_text())
    lost = next(name for name in marker["files"] if name.endswith(".sst"))
    (marker_path.parent / lost).unlink()
    del marker["files"][lost]
    marker_path.write_text(json.dumps(marker))
    with caplog.at_level(logging.WARNING, logger="pystatestore.rocksdb"):
        b, result = restore(store, tmp_path / "w2", rec, 3)
    assert state_of(b, 3) == expected, result.metrics  # from an older copy or the checkpoint
    assert not marker_path.parent.exists()  # dropped, so a retry does not meet it again
    assert any("does not open" in r.getMessage() for r in caplog.records), caplog.text


def test_names_that_only_look_like_versions_never_fail_a_commit(tmp_path: Path) -> None:
    """`str.isdigit` accepts '²', which `int` refuses: such a name beside the copies must not fail a
    commit that is already durable."""
    store, rec = tmp_path / "store", tmp_path / "rec"
    commit_versions(store, tmp_path / "w1", rec, n=3)
    (key_dir,) = (rec / "v1").iterdir()
    (key_dir / "\u00b2-x").mkdir()
    (key_dir / "changes").mkdir(mode=0o700, exist_ok=True)
    (key_dir / "changes" / "\u00b2-x.changes").write_bytes(b"x")
    b = make_backend("rocksdb", store, tmp_path / "w2", options={"localRecoveryDir": str(rec)})
    commit(b, 0, changes(BIG), "t1-again")


def test_a_commit_never_forgets_copies_through_a_symbolic_link(tmp_path: Path) -> None:
    """A commit forgets copies of later versions: never in a directory a symbolic link leads to."""
    store, rec = tmp_path / "store", tmp_path / "rec"
    commit_versions(store, tmp_path / "w1", rec, n=3)
    (key_dir,) = (rec / "v1").iterdir()
    outside = tmp_path / "outside"
    (outside / "9-someone").mkdir(parents=True)
    (outside / "changes").mkdir()
    (outside / "changes" / "9-someone.changes").write_bytes(b"x")
    shutil.rmtree(key_dir)
    os.symlink(outside, key_dir)
    b = make_backend("rocksdb", store, tmp_path / "w2", options={"localRecoveryDir": str(rec)})
    commit(b, 0, changes(BIG), "t1-again")
    assert (outside / "9-someone").is_dir() and (outside / "changes" / "9-someone.changes").is_file()


@pytest.mark.parametrize("field", ["store", "version", "manifestId"])
def test_a_copy_whose_marker_does_not_describe_it_is_ignored(tmp_path: Path, field: str) -> None:
    rec = tmp_path / "rec"
    expected = commit_versions(tmp_path / "store", tmp_path / "w1", rec, keep=1)
    (marker,) = rec.rglob(MARKER)
    doc = json.loads(marker.read_text())
    doc[field] = {"store": "file:/other", "version": 99, "manifestId": "f" * 32}[field]
    marker.write_text(json.dumps(doc))
    b, result = restore(tmp_path / "store", tmp_path / "w2", rec, 3)
    assert result.metrics["restoreLocalFiles"] == 0
    assert state_of(b, 3) == expected


def removing_the_copy_at_the_first_restored_file(recovery: Path) -> object:
    """A fault hook: when the first file of a restore from a local copy is in place, the copy
    directory it comes from is removed, as another instance of the store on this host does when
    its commit prunes older copies (the model test found this: a competing attempt's commit)."""
    removed: list[Path] = []

    def hook(point: str) -> None:
        if point == "restore:file" and not removed:
            newest = max(recovery.rglob(MARKER), key=lambda p: int(p.parent.name.split("-")[0])).parent
            shutil.rmtree(newest)
            removed.append(newest)

    return hook


@pytest.mark.parametrize("mode", MODES)
def test_a_copy_pruned_while_it_is_restored_falls_back_to_the_checkpoint(
    tmp_path: Path, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    expected = commit_versions(tmp_path / "store", tmp_path / "w1", tmp_path / "rec", mode=mode)
    b = make_backend(
        "rocksdb", tmp_path / "store", tmp_path / "w2", options={"localRecoveryDir": str(tmp_path / "rec")}
    )
    b.fault_hook = removing_the_copy_at_the_first_restored_file(tmp_path / "rec")
    with caplog.at_level(logging.WARNING, logger="pystatestore.rocksdb"):
        result = b.load(3)
    assert "was removed while it was being restored" in caplog.text and "version 3" in caplog.text
    assert result.metrics["restoreRemoteFiles"] > 0 or result.metrics["restoreChangelogVersions"] > 0
    assert state_of(b, 3) == expected
    b.fault_hook = None
    commit(b, 3, changes({b"after": b"1"}), "t4")  # the store goes on from what it restored
    assert state_of(make_backend("rocksdb", tmp_path / "store", tmp_path / "w3"), 4) == expected | {b"after": b"1"}


def test_a_local_file_removed_between_check_and_link_is_downloaded(tmp_path: Path) -> None:
    """A snapshot restore takes single files from any copy that has them; one pruned between its
    check and its link is downloaded instead."""
    expected = commit_versions(tmp_path / "store", tmp_path / "w1", tmp_path / "rec", mode="snapshot")
    for marker in list((tmp_path / "rec").rglob(MARKER)):  # no whole copy of version 3: file by file
        if marker.parent.name.startswith("3-"):
            shutil.rmtree(marker.parent)
    b = make_backend(
        "rocksdb", tmp_path / "store", tmp_path / "w2", options={"localRecoveryDir": str(tmp_path / "rec")}
    )
    assert b.local_copies is not None
    find = b.local_copies.find
    pruned: list[Path] = []

    def find_then_prune(*args: object, **kwargs: object) -> Path | None:
        found = find(*args, **kwargs)
        if found is not None and found.suffix == ".sst" and not pruned:
            found.unlink()
            pruned.append(found)
        return found

    b.local_copies.find = find_then_prune  # type: ignore[method-assign]
    result = b.load(3)
    assert pruned and result.metrics["restoreRemoteFiles"] >= 1
    assert state_of(b, 3) == expected


def test_a_copy_pruned_while_it_is_saved_skips_that_version_only(tmp_path: Path) -> None:
    """Another instance of the store on the host pruning a half-saved copy is a passing race: that
    version has no copy, and the next commit keeps one again (it used to turn copies off for the
    worker's life)."""
    rec = tmp_path / "rec"
    b = make_backend(
        "rocksdb", tmp_path / "store", tmp_path / "w1", options={"localRecoveryDir": str(rec)}, mode="snapshot"
    )
    assert b.local_copies is not None

    def prune_the_half_saved_copy(point: str) -> None:
        if point == "local-save:moved":
            for d in list(rec.glob("v1/*/*")):
                if not (d / MARKER).exists():
                    shutil.rmtree(d)

    b.local_copies.hook = prune_the_half_saved_copy
    commit(b, 0, changes({b"a": b"1"}), "t1")
    b.local_copies.hook = None
    assert not list(rec.rglob(MARKER)) and b.local_copies.enabled
    commit(b, 1, changes({b"b": b"2"}), "t2")
    assert [m.parent.name.split("-")[0] for m in rec.rglob(MARKER)] == ["2"]


# -- a same-host restore reads no data from the checkpoint (issue 29) ------------------------------
DATA_DIRS = ("shared", "private", "changelog")  # everything but manifests (and snapshot manifests)


def commit_with_maintenance(
    store: Path, work: Path, rec: Path, mode: str, versions: int, *, retain: int = 100, salt: str = ""
) -> dict[bytes, bytes]:
    """Changelog or snapshot commits whose changes never fit inside a manifest, a copy every 4th
    version, and maintenance snapshots every 2 versions (so the checkpoint holds snapshots newer
    than the newest copy), then garbage collection as if an hour had passed; returns the state of
    the last version."""
    b = make_backend(
        "rocksdb",
        store,
        work,
        retain=retain,
        options={"localRecoveryDir": str(rec), "localRecoveryInterval": "4", "inlineThresholdBytes": "0"},
        mode=mode,
        min_deltas=2,
    )
    state: dict[bytes, bytes] = {}
    for v in range(1, versions + 1):
        puts = {f"k{(v * 37 + i) % 900:04d}".encode(): f"{salt}{v}-{i}".encode() * 4 for i in range(300)}
        deletes = [k for k in sorted(state)[:20]] if v % 3 == 0 else []
        commit(b, v - 1, changes(puts, deletes), f"t{v}")
        state = {k: x for k, x in state.items() if k not in deletes} | puts
        materialize_if_due(b)
    b.maintenance(now=time.time() + 3600)
    b.close()
    return state


def hide_data_files(store: Path, aside: Path) -> None:
    """Moves every data file of the checkpoint out of reach, leaving the manifests: a restore that
    still succeeds read none of them (the referee does not rely on the restore's own counts)."""
    aside.mkdir()
    for name in DATA_DIRS:
        if (store / name).exists():
            shutil.move(str(store / name), str(aside / name))


@pytest.mark.parametrize("mode", MODES)
def test_a_same_host_restore_reads_no_data_file_from_the_checkpoint(tmp_path: Path, mode: str) -> None:
    store, rec = tmp_path / "store", tmp_path / "rec"
    expected = commit_with_maintenance(store, tmp_path / "w1", rec, mode, versions=10)
    if mode == "changelog":
        # The test backend is partition 1: copies of versions 7 and 3; maintenance snapshotted
        # later versions, which a restore of 10 must pass over for the copy.
        assert sorted(int(m.parent.name.split("-")[0]) for m in rec.rglob(MARKER)) == [3, 7]
        assert any(int(p.name.split("-")[0]) > 7 for p in (store / "snapshots").glob("*.json"))
    hide_data_files(store, tmp_path / "aside")
    b, result = restore(store, tmp_path / "w2", rec, 10)
    assert state_of(b, 10) == expected
    assert (result.metrics["restoreRemoteFiles"], result.metrics["restoreRemoteBytes"]) == (0, 0), result.metrics
    assert result.bytes_read == 0 and result.source == "local-copy", (result.bytes_read, result.source)
    if mode == "changelog":
        assert result.metrics["restoreChangelogVersions"] == 3, result.metrics  # 8, 9, 10 from kept changes


@pytest.mark.parametrize("mode", MODES)
def test_a_checkpoint_started_again_at_the_same_path_keeps_its_own_copies(tmp_path: Path, mode: str) -> None:
    """A user deletes a checkpoint and starts the query again at the same path: the old history's
    copies and kept changes, at higher versions, must not outrank the new history's (they did: the
    restart of an 8-batch scale run read 7 of 51 MiB from the checkpoint)."""
    store, rec = tmp_path / "store", tmp_path / "rec"
    commit_with_maintenance(store, tmp_path / "w1", rec, mode, versions=14, salt="old")
    shutil.rmtree(store)
    expected = commit_with_maintenance(store, tmp_path / "w2", rec, mode, versions=10, salt="new")
    on_host = [*rec.rglob("*.changes"), *(m.parent for m in rec.rglob(MARKER))]
    versions_on_host = [int(p.name.split("-")[0]) for p in on_host]
    assert max(versions_on_host) == 10, sorted(versions_on_host)  # nothing of the old history's 11-14
    hide_data_files(store, tmp_path / "aside")
    b, result = restore(store, tmp_path / "w3", rec, 10)
    assert state_of(b, 10) == expected
    assert (result.metrics["restoreRemoteFiles"], result.metrics["restoreRemoteBytes"]) == (0, 0), result.metrics


def test_kept_changes_go_with_the_copies_they_follow(tmp_path: Path) -> None:
    """Only the changes after the oldest kept copy stay on the host: older ones can never be replayed."""
    store, rec = tmp_path / "store", tmp_path / "rec"
    commit_with_maintenance(store, tmp_path / "w1", rec, "changelog", versions=14)
    copies = sorted(int(m.parent.name.split("-")[0]) for m in rec.rglob(MARKER))
    kept = sorted(int(p.name.split("-")[0]) for p in rec.rglob("*.changes"))
    assert copies == [7, 11] and kept == [8, 9, 10, 11, 12, 13, 14], (copies, kept)
    assert all(stat.S_IMODE(p.parent.stat().st_mode) == 0o700 for p in rec.rglob("*.changes"))


def test_damaged_kept_changes_are_fetched_alone_and_named(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store, rec = tmp_path / "store", tmp_path / "rec"
    expected = commit_with_maintenance(store, tmp_path / "w1", rec, "changelog", versions=10)
    damaged = min(rec.rglob("9-*.changes"))
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0x01
    damaged.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="pystatestore.store.local_recovery"):
        b, result = restore(store, tmp_path / "w2", rec, 10)
    assert result.metrics["restoreRemoteFiles"] == 1, result.metrics  # version 9's changes only
    assert any(str(damaged) in r.getMessage() for r in caplog.records), caplog.text
    assert state_of(b, 10) == expected


def test_without_local_files_the_restore_comes_from_the_checkpoint(tmp_path: Path) -> None:
    store, rec = tmp_path / "store", tmp_path / "rec"
    expected = commit_with_maintenance(store, tmp_path / "w1", rec, "changelog", versions=10)
    shutil.rmtree(rec)  # a new host, or a wiped disk
    b, result = restore(store, tmp_path / "w2", rec, 10)
    assert result.metrics["restoreLocalFiles"] == 0 and result.metrics["restoreRemoteFiles"] > 0, result.metrics
    assert result.bytes_read > 0
    assert state_of(b, 10) == expected


def test_a_snapshot_passed_over_is_taken_when_gc_removed_the_chain_to_the_copy(tmp_path: Path) -> None:
    """Retention keeps only the chain back to the newest snapshot: the manifests between it and an
    older local copy are gone, so the restore takes the snapshot from the checkpoint (found by the
    model test: the walk past the snapshot read a removed manifest and failed the commit)."""
    store, rec = tmp_path / "store", tmp_path / "rec"
    expected = commit_with_maintenance(store, tmp_path / "w1", rec, "changelog", versions=10, retain=1)
    assert not (store / "manifests" / "7.json").exists()  # the copy's version, collected
    b, result = restore(store, tmp_path / "w2", rec, 10)
    assert result.metrics["restoreRemoteFiles"] + result.metrics["restoreInlineSnapshots"] > 0, result.metrics
    assert state_of(b, 10) == expected
