"""The service's changelog calls as the JVM makes them: maintenance makes snapshots without holding
the store during the upload, the change feed frame, snapshot replay, and clear refusals."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pyarrow as pa

from backend_support import changes, hold_at, read_view
from pystatestore.store import frames
from pystatestore.worker.service import StoreService


def open_store(service: StoreService, tmp_path: Path, **options: str) -> str:
    local = tmp_path / "local"
    (local / "views").mkdir(parents=True, exist_ok=True)
    desc = {
        "storeDir": f"file:{tmp_path / 'store'}",
        "instanceId": "i1",
        "operatorId": 0,
        "partitionId": 0,
        "storeName": "default",
        "keySchema": "k",
        "valueSchema": "v",
        "minVersionsToRetain": 100,
        "minDeltasForSnapshot": 2,
        "localDir": str(local),
        "viewsDir": str(local / "views"),
        "options": {"localRecoveryDir": str(local / "rec"), **options},
    }
    reply = json.loads(service.openStore(json.dumps(desc)))
    assert "error" not in reply, reply
    return reply["handle"]


def manifest_id(tmp_path: Path, version: int) -> str:
    return json.loads((tmp_path / "store" / "manifests" / f"{version}.json").read_text())["manifest_id"]


def commit_ok(
    service: StoreService, handle: str, tmp_path: Path, version: int, puts: dict, deletes: list, keys: int
) -> dict:
    frame = tmp_path / f"changes-{version}.arrow"
    table = frames.sorted_by_key(changes(puts, deletes))
    with pa.OSFile(str(frame), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
        w.write_table(table)
    view = tmp_path / "local" / "views" / f"v{version}"
    base_id = manifest_id(tmp_path, version - 1) if version > 1 else ""
    reply = json.loads(service.commit(handle, version - 1, base_id, str(frame), "a", keys, 0, str(view)))
    assert "error" not in reply, reply
    return reply


def test_maintenance_uploads_a_snapshot_while_commits_go_on(tmp_path: Path) -> None:
    service = StoreService()
    handle = open_store(service, tmp_path)
    commit_ok(service, handle, tmp_path, 1, {b"a": b"1", b"b": b"1"}, [], 2)
    commit_ok(service, handle, tmp_path, 2, {b"c": b"2"}, [b"a"], 2)
    backend = service._stores[handle].backend
    uploading, release = hold_at(backend, "materialize:uploaded")
    replies: list[dict] = []
    worker = threading.Thread(target=lambda: replies.append(json.loads(service.maintenance(handle))))
    worker.start()
    assert uploading.wait(30), "maintenance made no snapshot of a chain of minDeltasForSnapshot versions"
    commit_ok(service, handle, tmp_path, 3, {b"d": b"3"}, [], 3)
    assert worker.is_alive(), "the commit was queued behind the snapshot upload"  # still held
    release.set()
    worker.join(30)
    backend.fault_hook = None
    assert replies and replies[0].get("materializedVersion") == 2, replies
    assert (tmp_path / "store" / "snapshots" / f"2-{manifest_id(tmp_path, 2)}.json").exists()
    # the snapshot is what a restore of version 3 starts from: one version replayed
    reply = json.loads(service.replay(handle, 2, "", 3, "", str(tmp_path / "local" / "views" / "replayed-3")))
    assert reply["restoreChangelogVersions"] == 1, reply
    assert read_view(tmp_path / "local" / "views" / "replayed-3") == {b"b": b"1", b"c": b"2", b"d": b"3"}


def test_the_change_feed_frame_holds_each_versions_changes(tmp_path: Path) -> None:
    service = StoreService()
    handle = open_store(service, tmp_path)
    commit_ok(service, handle, tmp_path, 1, {b"a": b"1", b"b": b"1"}, [], 2)
    commit_ok(service, handle, tmp_path, 2, {b"b": b"2"}, [b"a"], 1)
    out = tmp_path / "feed.arrow"
    reply = json.loads(service.changes(handle, 1, 2, "", str(out)))
    assert reply == {"rows": 4}, reply
    table = pa.ipc.open_stream(out.read_bytes()).read_all()
    assert table.schema.equals(frames.CHANGE_FEED_SCHEMA)
    assert table.to_pylist() == [
        {"version": 1, "op": frames.OP_PUT, "key": b"a", "value": b"1"},
        {"version": 1, "op": frames.OP_PUT, "key": b"b", "value": b"1"},
        {"version": 2, "op": frames.OP_DELETE, "key": b"a", "value": None},
        {"version": 2, "op": frames.OP_PUT, "key": b"b", "value": b"2"},
    ]
    bad = json.loads(service.changes(handle, 2, 1, "", str(out)))
    assert "changeStartBatchId" in bad["error"]["message"], bad


def test_the_memory_backend_refuses_the_change_feed_and_replay_naming_the_conf(tmp_path: Path) -> None:
    service = StoreService()
    handle = open_store(service, tmp_path, backend="memory")
    feed = json.loads(service.changes(handle, 1, 1, "", str(tmp_path / "feed.arrow")))
    assert "memory backend records no per-version changes" in feed["error"]["message"], feed
    assert "pystatestore.backend=rocksdb" in feed["error"]["message"], feed
    replay = json.loads(service.replay(handle, 1, "", 1, "", str(tmp_path / "local" / "views" / "v")))
    assert "keeps no snapshots" in replay["error"]["message"], replay


def test_open_refuses_a_bad_min_deltas_for_snapshot(tmp_path: Path) -> None:
    service = StoreService()
    desc = {
        "storeDir": f"file:{tmp_path}",
        "operatorId": 0,
        "partitionId": 0,
        "storeName": "default",
        "keySchema": "k",
        "valueSchema": "v",
        "minVersionsToRetain": 1,
        "minDeltasForSnapshot": 0,
    }
    reply = json.loads(service.openStore(json.dumps(desc)))
    assert "minDeltasForSnapshot=0" in reply["error"]["message"], reply


def snapshot_versions(tmp_path: Path) -> set[int]:
    return {int(p.name.split("-", 1)[0]) for p in (tmp_path / "store" / "snapshots").glob("*.json")}


def test_a_snapshot_found_not_due_is_made_once_later_commits_make_it_due(tmp_path: Path) -> None:
    service = StoreService()
    handle = open_store(service, tmp_path)  # minDeltasForSnapshot 2
    try:
        commit_ok(service, handle, tmp_path, 1, {b"a": b"1"}, [], 1)
        for _ in range(2):  # the second look at version 1 is the one maintenance may skip
            assert "error" not in json.loads(service.maintenance(handle, "snapshot"))
        assert snapshot_versions(tmp_path) == set(), "a snapshot of a chain shorter than minDeltasForSnapshot"
        commit_ok(service, handle, tmp_path, 2, {b"b": b"2"}, [], 2)
        assert "error" not in json.loads(service.maintenance(handle, "snapshot"))
        assert snapshot_versions(tmp_path) == {2}, "maintenance made no snapshot of a due chain"
    finally:
        service.close_all()


def test_a_cleanup_with_nothing_new_waits_at_most_the_recheck_interval(tmp_path: Path) -> None:
    """Periodic cleanups with no commit or snapshot since the last one are skipped for
    CLEANUP_RECHECK_SECONDS; one after a commit, or after that long, runs and deletes."""
    from pystatestore.worker.open_store import CLEANUP_RECHECK_SECONDS

    service = StoreService()
    handle = open_store(service, tmp_path)
    backend = service._stores[handle].backend
    clock_offset = [0.0]
    backend.clock = lambda: time.time() + clock_offset[0]
    store = tmp_path / "store"

    def orphan(name: str) -> Path:
        # What a dead attempt on another executor left: no manifest names it, past the grace period.
        path = store / "changelog" / f"{name}-{'0' * 32}.changes"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"left behind")
        os.utime(path, (time.time() - 3600, time.time() - 3600))
        return path

    try:
        commit_ok(service, handle, tmp_path, 1, {b"a": b"1"}, [], 1)
        first = orphan("901")
        assert "error" not in json.loads(service.maintenance(handle, "cleanup"))
        assert not first.exists(), "the first cleanup left an expired orphan"
        second = orphan("902")
        assert json.loads(service.maintenance(handle, "cleanup")).get("cleanupSkipped") is True
        assert second.exists()
        commit_ok(service, handle, tmp_path, 2, {b"b": b"2"}, [], 2)
        assert "error" not in json.loads(service.maintenance(handle, "cleanup"))
        assert not second.exists(), "a cleanup after a commit did not run"
        third = orphan("903")
        assert json.loads(service.maintenance(handle, "cleanup")).get("cleanupSkipped") is True
        clock_offset[0] = CLEANUP_RECHECK_SECONDS + 1
        assert "error" not in json.loads(service.maintenance(handle, "cleanup"))
        assert not third.exists(), f"no cleanup ran {CLEANUP_RECHECK_SECONDS + 1} s after the last one"
    finally:
        service.close_all()


def test_a_snapshot_asked_for_during_an_upload_is_made_when_it_ends(tmp_path: Path) -> None:
    """The shim asks for a snapshot at every commit that makes one due; one that comes while the
    last is uploading is not dropped: the maker looks again when done, so the newest version of a
    fast-growing state has its snapshot without waiting for Spark's next periodic maintenance."""
    service = StoreService()
    handle = open_store(service, tmp_path)
    commit_ok(service, handle, tmp_path, 1, {b"a": b"1"}, [], 1)
    commit_ok(service, handle, tmp_path, 2, {b"b": b"2"}, [], 2)
    backend = service._stores[handle].backend
    uploading, release = hold_at(backend, "materialize:uploaded")
    replies: list[dict] = []
    worker = threading.Thread(target=lambda: replies.append(json.loads(service.maintenance(handle, "snapshot"))))
    worker.start()
    assert uploading.wait(30)
    commit_ok(service, handle, tmp_path, 3, {b"c": b"3"}, [], 3)
    commit_ok(service, handle, tmp_path, 4, {b"d": b"4"}, [], 4)  # two versions since 2: due
    asked = json.loads(service.maintenance(handle, "snapshot"))
    assert "materializedVersion" not in asked, asked  # returned at once: one is being made
    release.set()
    worker.join(30)
    backend.fault_hook = None
    assert replies and replies[0].get("materializedVersion") == 4, replies
    made = sorted(p.name.split("-")[0] for p in (tmp_path / "store" / "snapshots").glob("*.json"))
    assert made == ["2", "4"], made


def test_a_snapshot_asked_for_again_of_the_same_version_costs_no_second_look(tmp_path: Path) -> None:
    """Spark's periodic maintenance landing during an upload, with no commit since, leaves nothing
    new to snapshot: the maker does not prepare again (reads under the store's lock)."""
    service = StoreService()
    handle = open_store(service, tmp_path)
    commit_ok(service, handle, tmp_path, 1, {b"a": b"1"}, [], 1)
    commit_ok(service, handle, tmp_path, 2, {b"b": b"2"}, [], 2)
    backend = service._stores[handle].backend
    prepared: list[object] = []
    prepare = backend.prepare_materialization
    backend.prepare_materialization = lambda force=False: prepared.append(prepare(force)) or prepared[-1]
    uploading, release = hold_at(backend, "materialize:uploaded")
    worker = threading.Thread(target=lambda: service.maintenance(handle, "snapshot"))
    worker.start()
    assert uploading.wait(30)
    json.loads(service.maintenance(handle, "snapshot"))  # Spark's periodic call, during the upload
    release.set()
    worker.join(30)
    backend.fault_hook = None
    assert len(prepared) == 1 and prepared[0] is not None, prepared
