"""Durable-first commits (decision 0032), as the JVM drives the worker: a changelog commit replies
once its segment and manifest are published; the local DB and the read view come after, under the
store's lock, and `awaitView` hands the JVM a view that is whole whatever happened to that apply.

The referee is the checkpoint itself: manifests are read from disk with json, views with rocksdict
(backend_support.read_view), never through the code under test."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from backend_support import changes, hold_at, make_backend, read_view
from pystatestore.store import frames
from pystatestore.worker.after_reply import AfterReplyThread
from pystatestore.worker.open_store import OpenStore
from pystatestore.worker.service import StoreService


def open_store(service: StoreService, tmp_path: Path, instance: str = "i1", **options: str) -> str:
    local = tmp_path / "local"
    (local / "views").mkdir(parents=True, exist_ok=True)
    desc = {
        "storeDir": f"file:{tmp_path / 'store'}",
        "instanceId": instance,
        "operatorId": 0,
        "partitionId": 1,  # as backend_support.make_backend
        "storeName": "default",
        "keySchema": "k",
        "valueSchema": "v",
        "minVersionsToRetain": 100,
        "minDeltasForSnapshot": 10,
        "localDir": str(local / instance),
        "viewsDir": str(local / "views"),
        "options": {"localRecoveryDir": str(local / "rec"), **options},
    }
    reply = json.loads(service.openStore(json.dumps(desc)))
    assert "error" not in reply, reply
    return reply["handle"]


def manifest_of(tmp_path: Path, version: int) -> dict:
    return json.loads((tmp_path / "store" / "manifests" / f"{version}.json").read_text())


def write_frame(path: Path, table: pa.Table) -> str:
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
        w.write_table(table)
    return str(path)


def view_path(tmp_path: Path, version: int, tag: str = "") -> Path:
    return tmp_path / "local" / "views" / f"v{version}{tag}"


def commit(service: StoreService, handle: str, tmp_path: Path, version: int, table: pa.Table, keys: int) -> dict:
    """The JVM's commit call; `table` is sent as it is (the JVM sorts its frames)."""
    frame = write_frame(tmp_path / f"changes-{version}.arrow", table)
    base_id = manifest_of(tmp_path, version - 1)["manifest_id"] if version > 1 else ""
    return json.loads(
        service.commit(handle, version - 1, base_id, frame, "a", keys, 0, str(view_path(tmp_path, version)))
    )


def await_view(service: StoreService, handle: str, tmp_path: Path, version: int) -> dict:
    manifest_id = manifest_of(tmp_path, version)["manifest_id"]
    return json.loads(service.awaitView(handle, version, manifest_id, str(view_path(tmp_path, version))))


def test_a_commit_replies_once_durable_and_its_view_follows(tmp_path: Path) -> None:
    service = StoreService()
    handle = open_store(service, tmp_path)
    backend = service._stores[handle].backend
    reached, release = hold_at(backend, "apply:written")
    reply = commit(service, handle, tmp_path, 1, changes({b"a": b"1", b"b": b"2"}), 2)
    assert "error" not in reply, reply
    assert reply["viewPending"] is True
    assert reached.wait(30), "the apply never ran"
    # The reply came while the apply is held: the version is durable, its view not yet there.
    assert manifest_of(tmp_path, 1)["num_keys"] == 2
    assert not (view_path(tmp_path, 1) / "CURRENT").exists()
    answers: list[dict] = []
    waiter = threading.Thread(target=lambda: answers.append(await_view(service, handle, tmp_path, 1)))
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive(), "awaitView returned while the apply was still running"
    release.set()
    waiter.join(30)
    backend.fault_hook = None
    assert answers and answers[0]["viewLeftByApply"] is True, answers
    assert read_view(view_path(tmp_path, 1)) == {b"a": b"1", b"b": b"2"}
    # The next commit builds on the applied local DB and reports that apply's times.
    reply = commit(service, handle, tmp_path, 2, frames.sorted_by_key(changes({b"c": b"3"}, [b"a"])), 2)
    assert "error" not in reply, reply
    assert reply["deferredApplyMs"] >= 0 and "checkpointMs" in reply, reply
    assert await_view(service, handle, tmp_path, 2)["viewLeftByApply"] is True
    assert read_view(view_path(tmp_path, 2)) == {b"b": b"2", b"c": b"3"}


@pytest.mark.parametrize("point", ["apply:written", "apply:ingested", "apply:checkpointed"])
def test_a_failed_apply_loses_nothing(tmp_path: Path, point: str) -> None:
    service = StoreService()
    handle = open_store(service, tmp_path)
    assert "error" not in commit(service, handle, tmp_path, 1, changes({b"a": b"1"}), 1)
    assert await_view(service, handle, tmp_path, 1)["viewLeftByApply"] is True
    backend = service._stores[handle].backend

    def fail(at: str) -> None:
        if at == point:
            raise OSError(f"injected at {at}")

    backend.fault_hook = fail
    reply = commit(service, handle, tmp_path, 2, changes({b"b": b"2"}), 2)
    assert "error" not in reply, reply  # durable before the apply failed
    answer = await_view(service, handle, tmp_path, 2)  # after the apply, which the hook failed
    backend.fault_hook = None
    assert "error" not in answer, answer
    # A view made before the failure stays (the JVM may be reading it); else it is loaded instead.
    assert answer["viewLeftByApply"] is (point == "apply:checkpointed")
    assert read_view(view_path(tmp_path, 2)) == {b"a": b"1", b"b": b"2"}
    # The store goes on from the restored local DB.
    assert commit(service, handle, tmp_path, 3, changes({b"c": b"3"}), 3)["applyFailures"] == 1
    assert await_view(service, handle, tmp_path, 3)["viewLeftByApply"] is True
    assert read_view(view_path(tmp_path, 3)) == {b"a": b"1", b"b": b"2", b"c": b"3"}


def test_a_view_whose_worker_died_is_loaded_by_the_next(tmp_path: Path) -> None:
    """A new worker (here a new service) never ran the apply: it loads the version, whatever the
    dead worker's apply left in the view directory."""
    first = StoreService()
    handle = open_store(first, tmp_path)
    backend = first._stores[handle].backend
    reached, release = hold_at(backend, "apply:ingested")
    assert "error" not in commit(first, handle, tmp_path, 1, changes({b"a": b"1", b"z": b"9"}), 2)
    assert reached.wait(30)
    assert not view_path(tmp_path, 1).exists()  # RocksDB makes a checkpoint under another name first
    view_path(tmp_path, 1).mkdir()
    (view_path(tmp_path, 1) / "CURRENT").write_text("half-written")  # whatever a dying worker may leave
    second = StoreService()
    handle2 = open_store(second, tmp_path, instance="i2")
    answer = json.loads(
        second.awaitView(handle2, 1, manifest_of(tmp_path, 1)["manifest_id"], str(view_path(tmp_path, 1)))
    )
    assert "error" not in answer, answer
    assert answer["viewLeftByApply"] is False
    assert read_view(view_path(tmp_path, 1)) == {b"a": b"1", b"z": b"9"}
    release.set()
    backend.fault_hook = None


def test_a_view_of_a_replaced_attempt_is_refused(tmp_path: Path) -> None:
    """Another attempt replaced the version this JVM committed (Spark ran the batch twice) before the
    JVM read it, and this worker's apply failed: the load must not hand over the other attempt's state."""
    service = StoreService()
    handle = open_store(service, tmp_path)
    backend = service._stores[handle].backend

    failed = threading.Event()

    def fail(at: str) -> None:
        if at == "apply:written":
            failed.set()
            raise OSError("injected")

    backend.fault_hook = fail
    assert "error" not in commit(service, handle, tmp_path, 1, changes({b"a": b"1"}), 1)
    ours = manifest_of(tmp_path, 1)["manifest_id"]
    assert failed.wait(30), "the apply never ran"
    backend.fault_hook = None
    other = make_backend("rocksdb", tmp_path / "store", tmp_path / "other")
    other.commit(0, changes({b"a": b"other"}), "other", num_keys=1)
    answer = json.loads(service.awaitView(handle, 1, ours, str(view_path(tmp_path, 1))))
    assert answer["error"]["type"] == "VersionReplacedError", answer
    assert ours in answer["error"]["message"]


def test_an_unsorted_frame_is_refused_before_anything_is_published(tmp_path: Path) -> None:
    service = StoreService()
    handle = open_store(service, tmp_path)
    unsorted = pa.table(
        {"op": pa.array([1, 1], pa.int8()), "key": [b"b", b"a"], "value": [b"1", b"2"]}, schema=frames.CHANGES_SCHEMA
    )
    reply = commit(service, handle, tmp_path, 1, unsorted, 2)
    assert "not sorted" in reply["error"]["message"], reply
    assert not (tmp_path / "store" / "manifests" / "1.json").exists()
    bad_op = pa.table({"op": pa.array([7], pa.int8()), "key": [b"a"], "value": [b"1"]}, schema=frames.CHANGES_SCHEMA)
    reply = commit(service, handle, tmp_path, 1, bad_op, 1)
    assert "unknown op" in reply["error"]["message"], reply
    assert not (tmp_path / "store" / "manifests" / "1.json").exists()


def test_durable_first_can_be_turned_off(tmp_path: Path) -> None:
    service = StoreService()
    handle = open_store(service, tmp_path, durableFirstCommit="false")
    reply = commit(service, handle, tmp_path, 1, changes({b"a": b"1"}), 1)
    assert "error" not in reply and "viewPending" not in reply, reply
    assert read_view(view_path(tmp_path, 1)) == {b"a": b"1"}  # there when the commit replied
    service2 = StoreService()
    with pytest.raises(AssertionError, match="durableFirstCommit"):
        open_store(service2, tmp_path, instance="i3", durableFirstCommit="maybe")


# -- who starts the work a commit leaves, and the after-reply thread (issue 66, item 3) ---------------


def pause_after_leaving_work(store: OpenStore) -> tuple[threading.Event, threading.Event]:
    """Stops the next call that leaves after-reply work on `store` right after it left it, still
    inside its locked block, until `go` is set (at most 30 s). Returns (left, go)."""
    left, go = threading.Event(), threading.Event()
    leave = store.run_after_reply

    def paused(*args: Any, **kwargs: Any) -> Any:
        del store.run_after_reply  # once: the class's method again
        result = leave(*args, **kwargs)
        left.set()
        go.wait(30)
        return result

    store.run_after_reply = paused  # type: ignore[method-assign]
    return left, go


def wait_until(done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not done():
        assert time.monotonic() < deadline, f"{what} never happened"
        time.sleep(0.01)


@pytest.mark.parametrize("failing", ["open_changes", "lock_wait"])
def test_a_call_that_never_held_the_store_starts_no_work(tmp_path: Path, failing: str) -> None:
    """A commit that fails before it holds the store's lock (its frame cannot be opened; its wait
    for the lock times out) while another commit holds it, its work left but not yet started, must
    start nothing: it started that work early, the holder then released the lock a first time and
    the work a second time, which raised on the after-reply thread and ended it, so every later
    durable-first commit of the worker kept its store's lock until calls timed out."""
    service = StoreService()
    handle = open_store(service, tmp_path, callTimeoutMs="1000")  # a call waits 1 s for its store
    store = service._stores[handle]
    backend = store.backend
    applying, apply_go = hold_at(backend, "apply:written")
    left, go = pause_after_leaving_work(store)
    replies: list[dict] = []
    committer = threading.Thread(
        target=lambda: replies.append(commit(service, handle, tmp_path, 1, changes({b"a": b"1"}), 1))
    )
    committer.start()
    assert left.wait(30), "the first commit left no work"
    if failing == "open_changes":
        missing = str(tmp_path / "missing.arrow")
        other = json.loads(service.commit(handle, 1, "", missing, "b", 1, 0, str(view_path(tmp_path, 2, "b"))))
    else:  # waits for the lock the paused commit holds, in vain
        other = commit(service, handle, tmp_path, 2, changes({b"b": b"2"}), 2)
        assert "waited too long" in other["error"]["message"], other
    assert "error" in other, other
    go.set()
    committer.join(30)
    assert replies and "error" not in replies[0], replies
    assert applying.wait(30), "the first commit's apply never ran"
    held_while_applying = store.lock.locked()
    apply_go.set()
    view_1 = str(view_path(tmp_path, 1))
    wait_until(lambda: view_1 in store.applied.views, "the first commit's apply")
    backend.fault_hook = None
    assert await_view(service, handle, tmp_path, 1)["viewLeftByApply"] is True
    # The worker goes on: the next durable-first commits' applies run and leave their views. (Two:
    # a lock released once too often shows in the first at the latest, a thread it ended in the second.)
    for version in (2, 3):
        reply = commit(service, handle, tmp_path, version, changes({b"k%d" % version: b"v"}), version)
        assert "error" not in reply and reply["viewPending"] is True, reply
        answer = await_view(service, handle, tmp_path, version)
        assert "error" not in answer, answer
        assert answer["viewLeftByApply"] is True
    assert read_view(view_path(tmp_path, 3)) == {b"a": b"1", b"k2": b"v", b"k3": b"v"}
    # Before any of that, the first commit's apply ran with the store free for any call.
    assert held_while_applying, "the store's lock was let go while the first commit's apply ran"


class AbandonedError(BaseException):
    """Not an Exception: what no `except Exception` of the work itself catches."""


def test_the_after_reply_thread_outlives_a_failed_apply(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An apply that raises what its own handling does not catch is logged with its store, releases
    the store and counts as failed (awaitView loads the version, the next commit reports the
    failure); the after-reply thread goes on with the next work."""
    service = StoreService()
    handle = open_store(service, tmp_path, callTimeoutMs="1000")
    backend = service._stores[handle].backend

    def abandon(at: str) -> None:
        if at == "apply:ingested":
            raise AbandonedError

    backend.fault_hook = abandon
    assert "error" not in commit(service, handle, tmp_path, 1, changes({b"a": b"1"}), 1)
    answer = await_view(service, handle, tmp_path, 1)
    backend.fault_hook = None
    assert "error" not in answer, answer
    assert answer["viewLeftByApply"] is False
    assert f"store {backend.ctx.store_dir}: unexpected failure applying version 1 after its commit" in caplog.text
    assert read_view(view_path(tmp_path, 1)) == {b"a": b"1"}
    reply = commit(service, handle, tmp_path, 2, changes({b"b": b"2"}), 2)
    assert "error" not in reply, reply
    answer = await_view(service, handle, tmp_path, 2)
    assert "error" not in answer, answer
    assert answer["viewLeftByApply"] is True
    assert reply["applyFailures"] == 1, reply
    assert read_view(view_path(tmp_path, 2)) == {b"a": b"1", b"b": b"2"}


def test_the_after_reply_thread_outlives_any_work() -> None:
    """Whatever one piece of work raises (a release included), the thread runs the next."""
    thread = AfterReplyThread()
    ran = threading.Event()

    def fail() -> None:
        raise AbandonedError

    thread.submit(fail)
    thread.submit(ran.set)
    assert ran.wait(30), "the work after a failed one never ran"
