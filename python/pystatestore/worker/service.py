"""The Spark-facing service: the object the JVM shim calls over Py4J (PythonStateService).

It maps store handles to backends, serialises calls per store (waiting a bounded time, and naming
the call that holds a store when it gives up), and turns every failure into a JSON error reply, so
the JVM can tell "the worker said no" from "the worker died".
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import queue
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow as pa

from ..release import __version__
from ..store import frames
from ..store.backends import BACKENDS, DEFAULT_BACKEND, LoadResult, StateBackend, StoreContext
from ..store.errors import StateStoreError, StoreConfigError
from ..store.leases import DEFAULT_ORPHAN_GRACE_SECONDS, validate_grace
from ..store.manifest import KEY_ENCODING_RAW
from ..store.remote import RemoteStore
from . import faults

PROTOCOL_VERSION = 9
MAINTENANCE_PARTS = ("snapshot", "cleanup")
DEFAULT_CALL_TIMEOUT_MS = 30 * 60 * 1000
CLOSE_WAIT_SECONDS = 10.0  # a close waits this long for a call in flight, then closes when it returns
# A cleanup of a store that has had no commit and no snapshot since its last one is run again only
# after this long, or after the store's grace period if shorter: its plan could change only by age
# (files and chains passing the grace period) or by writers elsewhere, so what becomes deletable
# waits at most one more grace period. At a maintenance interval of 2 s and 200 partitions, cleanups
# that found nothing new were most of the worker's CPU (decision 0038).
CLEANUP_RECHECK_SECONDS = 30.0
log = logging.getLogger("pystatestore.service")


def context_from_description(desc: dict[str, Any]) -> StoreContext:
    options = {str(k): str(v) for k, v in desc.get("options", {}).items()}
    store = str(desc["storeDir"])
    grace = validate_grace(options.get("orphanGraceSeconds", DEFAULT_ORPHAN_GRACE_SECONDS), store=store)
    return StoreContext(
        store_dir=store,
        operator_id=int(desc["operatorId"]),
        partition_id=int(desc["partitionId"]),
        store_name=str(desc["storeName"]),
        key_schema=str(desc["keySchema"]),
        value_schema=str(desc["valueSchema"]),
        min_versions_to_retain=int(desc["minVersionsToRetain"]),
        orphan_grace_seconds=grace,
        options=options,
        local_dir=str(desc.get("localDir", "")),
        key_encoding=str(desc.get("keyEncoding", KEY_ENCODING_RAW)),
        views_dir=str(desc.get("viewsDir", "")),
        host_dir=str(desc.get("hostDir", "")),
        min_deltas_for_snapshot=_positive_int(desc.get("minDeltasForSnapshot", 10), "minDeltasForSnapshot", store),
        checkpoint_ids=bool(desc.get("checkpointIds", False)),
    )


def _positive_int(value: Any, name: str, store: str) -> int:
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if n < 1:
        raise StoreConfigError(f"{name}={value!r} is not a positive whole number", store=store)
    return n


_libc: Any = None


def release_free_memory() -> None:
    """Hands memory freed by a commit (RocksDB's memtable, write batches) back to the OS, so the
    worker's resident memory follows what it uses rather than its high-water mark (glibc only)."""
    global _libc
    if _libc is False:
        return
    try:
        if _libc is None:
            _libc = ctypes.CDLL("libc.so.6")
        _libc.malloc_trim(0)
    except (OSError, AttributeError):
        _libc = False  # not glibc: nothing to do


def worker_rss_bytes() -> int:
    """This worker's resident memory, reported to Spark with every load and commit (read without
    Python's buffered text file, which cost a commit half a millisecond)."""
    try:
        fd = os.open("/proc/self/statm", os.O_RDONLY)
        try:
            return int(os.read(fd, 256).split()[1]) * _PAGE_SIZE
        finally:
            os.close(fd)
    except (OSError, ValueError, IndexError):
        return 0


_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def lock_wait_seconds(ctx: StoreContext) -> float:
    """How long a call waits for its store: a little less than the JVM waits for the call, so the
    JVM hears why (and which call holds the store) rather than only that it timed out."""
    try:
        call_ms = float(ctx.options.get("callTimeoutMs", DEFAULT_CALL_TIMEOUT_MS))
    except ValueError:
        raise StoreConfigError(
            f"callTimeoutMs={ctx.options['callTimeoutMs']!r} is not a number", store=ctx.store_dir
        ) from None
    return max(1.0, call_ms / 1000 * 0.9)


def make_backend(ctx: StoreContext) -> StateBackend:
    name = ctx.options.get("backend", DEFAULT_BACKEND)
    cls = BACKENDS.get(name)
    if cls is None:
        raise StoreConfigError(f"unknown backend {name!r} (known: {', '.join(sorted(BACKENDS))})", store=ctx.store_dir)
    backend = cls(ctx, RemoteStore(ctx.store_dir))
    faults.install(backend)  # a no-op unless a test set PYSTATESTORE_TEST_FAULTS
    return backend


class _AfterReply:
    """One daemon thread per worker that runs work left after replies, in order. Starting a thread
    per commit made the reply wait for the new thread to take the GIL and then for it to give it
    back (up to Python's 5 ms switch interval) while it wrote the SST: 2 ms a commit of 250 keys."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="after-reply", daemon=True)
                self._thread.start()
        self._jobs.put(job)

    def _run(self) -> None:
        while True:
            self._jobs.get()()  # each job logs its own failures and releases its store


_after_reply = _AfterReply()

# How many outcomes of durable-first applies a store remembers for `awaitView`: a view the JVM
# never reads before it is evicted from its cache is never asked about.
APPLIED_VIEWS_KEPT = 16


class _Store:
    def __init__(self, backend: StateBackend) -> None:
        self.backend = backend
        self.lock = threading.Lock()
        self.busy_with: str | None = None  # the call holding the lock, for "store busy" errors
        self.busy_since = 0.0
        self.snapshotting = False  # a snapshot is being made (uploaded without the lock)
        # Work a call leaves to run under the lock after it replied (a durable-first commit's apply).
        # Only the thread holding the lock touches it: the call that leaves it, then starts it.
        self._after: tuple[str, Callable[[], None]] | None = None
        # View directory -> whether the apply that was to leave it did (newest last).
        self.applied_views: OrderedDict[str, bool] = OrderedDict()
        # The metrics of the newest apply that ran after its commit replied, for the next commit's reply.
        self.apply_metrics: dict[str, int] = {}
        # When the last cleanup began (the backend's clock), and whether a commit or a snapshot of
        # this store came after: the two `cleanup_can_wait` decides by. Touched under the lock only.
        self.cleanup_began = 0.0
        self.changed_since_cleanup = True  # until the first cleanup

    def cleanup_can_wait(self, now: float) -> bool:
        """Inside `locked`: whether a cleanup now would only repeat the last one's plan, aged by
        less than CLEANUP_RECHECK_SECONDS or the grace period (nothing committed or snapshotted here since)."""
        return not self.changed_since_cleanup and 0 <= now - self.cleanup_began < min(
            CLEANUP_RECHECK_SECONDS, self.backend.ctx.orphan_grace_seconds
        )

    def run_after_reply(self, what: str, work: Callable[[], None]) -> None:
        """Inside `locked`: the lock stays held when the call leaves the block, and `work` runs on
        the worker's after-reply thread once `start_after_reply` is called (when the reply is ready,
        so the two do not contend for the GIL before it is sent); the store's next call waits."""
        self._after = (what, work)

    def start_after_reply(self) -> None:
        """Starts the work a call left under the lock (none: nothing to do). Call exactly once after
        every call that may have left some, whatever its outcome."""
        after, self._after = self._after, None
        if after is not None:
            work = after[1]
            _after_reply.submit(lambda: self._run_then_release(work))

    def _run_then_release(self, work: Callable[[], None]) -> None:
        try:
            work()
        except Exception:  # noqa: BLE001 - the work records its own outcome; never leave the lock held
            log.error("unexpected failure after a reply\n%s", traceback.format_exc())
        finally:
            self.busy_with = None
            self.lock.release()

    @contextmanager
    def locked(self, call: str, handle: str) -> Iterator[StateBackend]:
        if not self.lock.acquire(timeout=lock_wait_seconds(self.backend.ctx)):
            holder, since = self.busy_with, self.busy_since
            raise StoreConfigError(
                f"{call} waited too long: the store is busy with {holder} (running for {time.time() - since:.0f} s)",
                store=handle,
                advice="The earlier call is stuck in the worker (see its log); Spark retries this task, and the "
                "JVM reopens the store in a fresh state after a call times out.",
            )
        self.busy_with, self.busy_since = call, time.time()
        self._after = None
        try:
            yield self.backend
        finally:
            if self._after is None:
                self.busy_with = None
                self.lock.release()
            else:  # held for the work left, until start_after_reply has run it
                self.busy_with, self.busy_since = self._after[0], time.time()


class StoreService:
    """Implements org.pystatestore.PythonStateService for the JVM."""

    class Java:
        implements = ["org.pystatestore.PythonStateService"]

    def __init__(self) -> None:
        self._stores: dict[str, _Store] = {}
        self._lock = threading.Lock()

    # -- protocol ----------------------------------------------------------------------------
    def hello(self) -> str:
        return _reply(
            lambda: {
                "protocol": PROTOCOL_VERSION,
                "version": __version__,
                "pid": os.getpid(),
                "backends": sorted(BACKENDS),
            }
        )

    def openStore(self, store_json: str) -> str:  # noqa: N802 (Java interface name)
        def run() -> dict[str, Any]:
            desc = json.loads(store_json)
            ctx = context_from_description(desc)
            # One backend per provider instance (see the JVM side): no cache outlives its query run.
            handle = f"{ctx.store_dir}#{desc.get('instanceId', '')}"
            replaced: list[_Store] = []
            with self._lock:
                existing = self._stores.get(handle)
                if existing is None or existing.backend.ctx != ctx:
                    if existing is not None:
                        replaced.append(existing)
                    self._stores[handle] = _Store(make_backend(ctx))
                gone = desc.get("replacesHandle")
                if gone and gone != handle and gone in self._stores:
                    replaced.append(self._stores.pop(gone))
            for store in replaced:
                _close_when_idle(store)
            backend = self._stores[handle].backend
            return {"handle": handle, "readPath": backend.read_path, "keyEncoding": ctx.key_encoding}

        return _reply(run)

    def load(self, handle: str, version: int, checkpoint_id: str, out_path: str, view_dir: str) -> str:
        """Makes `version` (its attempt `checkpoint_id`, unless "") readable by the JVM: a state frame
        at `out_path`, or (view backends) a read view at `view_dir`."""

        def run() -> dict[str, Any]:
            started = time.perf_counter()
            with self._store(handle).locked(f"load of version {version}", handle) as backend:
                result = backend.load(int(version), view_dir or None, str(checkpoint_id) or None)
            _log_restore(handle, int(version), result)
            if result.frame is not None:
                frames.write_buffer(out_path, result.frame)
            return _load_reply(result, started)

        return _reply(run)

    def commit(
        self,
        handle: str,
        base_version: int,
        base_manifest_id: str,
        changes_path: str,
        attempt_id: str,
        num_keys: int,
        num_internal_keys: int,
        view_dir: str,
        force_snapshot: bool = False,
        empty_base: bool = False,
    ) -> str:
        """Makes `base_version + 1` durable from the change frame; with `force_snapshot` (Spark
        4.2's forceSnapshotOnCommit) it also has a snapshot before the call returns; with
        `empty_base` (Spark's loadEmpty) the frame is the whole new state."""

        called: list[_Store] = []  # the store, once found: what the commit left starts after the reply

        def run() -> dict[str, Any]:
            started = time.perf_counter()
            store = self._store(handle)
            called.append(store)
            version = int(base_version) + 1
            with (
                frames.open_changes(changes_path) as changes,
                store.locked(f"commit of version {version}", handle) as backend,
            ):
                previous_apply, store.apply_metrics = store.apply_metrics, {}
                store.changed_since_cleanup = True  # a failed attempt may leave files too
                result = backend.commit(
                    int(base_version),
                    changes,
                    str(attempt_id),
                    str(base_manifest_id),
                    num_keys=int(num_keys) if int(num_keys) >= 0 else None,
                    num_internal_keys=int(num_internal_keys),
                    view_dir=view_dir or None,
                    empty_base=bool(empty_base),
                    durable_first=not force_snapshot,
                )
                if result.finish is not None:
                    store.run_after_reply(
                        f"applying version {version} after its commit",
                        _apply_after_reply(store, handle, version, view_dir, result.finish),
                    )
            snapshot = self._snapshot(store, handle, force=True) if force_snapshot else {}
            # The chain since the last snapshot is minDeltasForSnapshot long: the JVM asks for the
            # snapshot at once (off the commit path) rather than at Spark's next maintenance, which
            # at its default interval of 60 s comes after tens of fast batches.
            due = not snapshot and result.snapshot_due
            if result.finish is None:
                release_free_memory()  # else the apply does, after the reply
            # The version the shim reports to Spark's coordinator as its newest snapshot, if this
            # call made one: the commit itself (snapshot commits), or the one Spark forced.
            snapshot_version = result.version if result.snapshot else snapshot.get("materializedVersion")
            return {
                **snapshot,
                **({"snapshotVersion": snapshot_version} if snapshot_version else {}),
                **({"snapshotDue": True} if due else {}),
                "workerRssBytes": worker_rss_bytes(),
                "version": result.version,
                "manifestId": result.manifest_id,
                "numKeys": result.num_keys,
                "numInternalKeys": result.num_internal_keys,
                "bytesWritten": result.bytes_written,
                "filesWritten": result.files_written,
                "manifest": result.manifest,
                "commitMs": _ms(started),
                **previous_apply,
                **result.metrics,
                **({"viewPending": True} if result.finish is not None else {}),
            }

        try:
            return _reply(run)
        finally:
            for store in called:
                store.start_after_reply()

    def awaitView(self, handle: str, version: int, manifest_id: str, view_dir: str) -> str:  # noqa: N802
        """Returns once the read view of `version` (the attempt `manifest_id`) a durable-first commit
        left to its apply is at `view_dir`: at once if the apply left it, after a load of the version
        from the checkpoint if the apply failed or this worker never ran it (the one that did died)."""

        def run() -> dict[str, Any]:
            started = time.perf_counter()
            store = self._store(handle)
            with store.locked(f"read view of version {version}", handle) as backend:
                waited = _ms(started)
                if store.applied_views.pop(view_dir, False):
                    return {"viewLeftByApply": True, "viewWaitMs": waited, "workerRssBytes": worker_rss_bytes()}
                view_after_commit = getattr(backend, "view_after_commit", None)
                if view_after_commit is None:
                    raise StoreConfigError(
                        "this backend leaves no read views",
                        store=handle,
                        version=int(version),
                        advice="The JVM shim and the Python package are of different pystatestore releases; "
                        "install the same release for both.",
                    )
                result = view_after_commit(int(version), str(manifest_id), str(view_dir))
            _log_restore(handle, int(version), result)
            return {**_load_reply(result, started), "viewLeftByApply": False, "viewWaitMs": waited}

        return _reply(run)

    def maintenance(self, handle: str, parts: str = "snapshot,cleanup") -> str:
        """The maintenance `parts` (comma-separated) in order: `snapshot` makes a snapshot of the
        changelog chain if one is due, `cleanup` applies retention and collects garbage. Spark 4.3
        runs the two from separate threads; earlier minors ask for both at once."""

        def run() -> dict[str, Any]:
            wanted = [p.strip() for p in str(parts).split(",") if p.strip()]
            unknown = sorted(set(wanted) - set(MAINTENANCE_PARTS))
            if unknown or not wanted:
                raise ValueError(
                    f"store {handle}: unknown maintenance part(s) {unknown or wanted}; "
                    f"expected some of {', '.join(MAINTENANCE_PARTS)}. The jar and the Python package "
                    "are of different releases"
                )
            store = self._store(handle)
            report: dict[str, Any] = {}
            if "snapshot" in wanted:
                report.update(self._snapshot(store, handle, force=False))
            if "cleanup" in wanted:
                with store.locked("maintenance", handle) as backend:
                    now = backend.clock()
                    if store.cleanup_can_wait(now):
                        report["cleanupSkipped"] = True
                    else:
                        store.cleanup_began, store.changed_since_cleanup = now, False
                        report.update(backend.maintenance(now))
            return report

        return _reply(run)

    def _snapshot(self, store: _Store, handle: str, *, force: bool) -> dict[str, Any]:
        """A snapshot of the newest changelog version if one is due (or `force`d). It is set up (hard
        links) under the store's lock but uploaded without it, so commits never wait for an upload."""
        with store.locked("maintenance (preparing a snapshot)", handle) as backend:
            if store.snapshotting and not force:
                return {}  # another call is making one: this one would upload the same again
            job = backend.prepare_materialization(force=force)
            if job is not None:
                store.snapshotting = True
        report: dict[str, Any] = {}
        if job is None:
            return report
        try:
            backend.finish_materialization(job)
        except (StateStoreError, OSError) as e:
            if force:
                raise
            # The chain stays as it is (restores replay a little more); collecting garbage
            # must not wait on storage that refused an upload.
            log.warning("store %s: making a snapshot failed, will retry: %s", handle, e)
            report["materializeError"] = str(e)
        finally:
            with store.locked("maintenance (recording a snapshot)", handle):
                backend.complete_materialization(job)
                store.snapshotting = False
                store.changed_since_cleanup = True  # older chains may have become garbage
        report.update(getattr(job, "metrics", {}))
        return report

    def changes(self, handle: str, start_version: int, end_version: int, end_id: str, out_path: str) -> str:
        """Writes the change feed of versions start..end (inclusive; end's attempt `end_id`, unless "")
        to `out_path` as an Arrow stream (version int64, op int8, key binary, value binary), version
        by version."""

        def run() -> dict[str, Any]:
            start, end = int(start_version), int(end_version)
            if start < 1 or end < start:
                raise StoreConfigError(
                    f"changes of versions {start} to {end}: the range must start at 1 or later and not end before "
                    "it starts",
                    store=handle,
                    advice="Check changeStartBatchId and changeEndBatchId (batch ids start at 0).",
                )
            rows = 0
            with (
                self._store(handle).locked(f"change feed of versions {start}-{end}", handle) as backend,
                pa.OSFile(out_path, "wb") as sink,
                pa.ipc.new_stream(sink, frames.CHANGE_FEED_SCHEMA) as writer,
            ):
                for version, batch in backend.changes(start, end, str(end_id) or None):
                    writer.write_batch(frames.change_feed_batch(version, batch))
                    rows += batch.num_rows
            return {"rows": rows}

        return _reply(run)

    def replay(
        self, handle: str, snapshot_version: int, snapshot_id: str, end_version: int, end_id: str, view_dir: str
    ) -> str:
        """Leaves a read view of `end_version` rebuilt from the snapshot of `snapshot_version` (ids ""
        unless Spark names the attempts)."""

        def run() -> dict[str, Any]:
            started = time.perf_counter()
            what = f"replay of version {end_version} from snapshot {snapshot_version}"
            with self._store(handle).locked(what, handle) as backend:
                result = backend.replay(
                    int(snapshot_version),
                    int(end_version),
                    view_dir or None,
                    snapshot_id=str(snapshot_id) or None,
                    end_id=str(end_id) or None,
                )
            _log_restore(handle, int(end_version), result)
            return _load_reply(result, started)

        return _reply(run)

    def closeStore(self, handle: str, wait_seconds: float = CLOSE_WAIT_SECONDS) -> str:  # noqa: N802
        """Closes a store now, or, if a call (a stuck one) still holds it, as soon as that returns:
        once it is out of the map nothing else would ever close it."""

        def run() -> dict[str, Any]:
            with self._lock:
                store = self._stores.pop(handle, None)
            if store is None:
                return {"closed": False}
            if not store.lock.acquire(timeout=wait_seconds):
                _close_when_idle(store)
                return {"closed": True, "deferred": True}
            try:
                store.backend.close()
            finally:
                store.lock.release()
            return {"closed": True}

        return _reply(run)

    def close_all(self, wait_seconds: float = 10.0) -> None:
        """Closes every store (the JVM is going away), giving calls in flight a little time."""
        with self._lock:
            stores, self._stores = list(self._stores.values()), {}
        for store in stores:
            if store.lock.acquire(timeout=wait_seconds):
                try:
                    store.backend.close()
                finally:
                    store.lock.release()
            else:
                log.warning(
                    "store %s still busy with %s at exit; leaving it", store.backend.ctx.store_dir, store.busy_with
                )

    # -- helpers -----------------------------------------------------------------------------
    def _store(self, handle: str) -> _Store:
        with self._lock:
            store = self._stores.get(handle)
        if store is None:
            raise StoreConfigError("store is not open in this worker (the JVM must call openStore first)", store=handle)
        return store


def _apply_after_reply(
    store: _Store, handle: str, version: int, view_dir: str, finish: Callable[[], dict[str, int]]
) -> Callable[[], None]:
    """A durable-first commit's apply, run after its reply under the store's lock: its outcome is
    what `awaitView` finds for `view_dir`, its metrics go with the store's next commit."""

    def apply() -> None:
        started = time.perf_counter()
        ok = False
        try:
            metrics = finish()
            ok = True
        except Exception as e:  # noqa: BLE001 - the version is durable; its view is made again on demand
            log.warning(
                "store %s: applying version %d to the local database after its commit failed (%s); the JVM's "
                "first read of it loads it from the checkpoint",
                handle,
                version,
                e,
            )
            metrics = {"applyFailures": 1}
        # A view, once made, is whole (the JVM may already read it) even if the apply failed after it.
        store.applied_views[view_dir] = ok or os.path.isdir(view_dir)
        while len(store.applied_views) > APPLIED_VIEWS_KEPT:
            store.applied_views.popitem(last=False)
        store.apply_metrics = {**metrics, "deferredApplyMs": _ms(started)}
        release_free_memory()

    return apply


def _close_when_idle(store: _Store) -> None:
    """Closes a replaced backend once the call it may still be running (a timed-out one) returns."""

    def close() -> None:
        with store.lock:
            store.backend.close()

    threading.Thread(target=close, name="close-replaced-store", daemon=True).start()


def _log_restore(handle: str, version: int, result: LoadResult) -> None:
    """One executor-log line per version rebuilt (not one already in memory): where its files came
    from is what tells a user whether local recovery works for them."""
    if result.source == "memory":
        return
    m = result.metrics
    if "restoreMs" not in m:  # a backend without per-source figures
        log.info(
            "store %s: restored version %d from %s (%d bytes read)", handle, version, result.source, result.bytes_read
        )
        return
    log.info(
        "store %s: restored version %d from %s in %d ms: %d files (%d bytes) from the local copy, "
        "%d files (%d bytes) from the checkpoint, changes of %d versions replayed",
        handle,
        version,
        result.source,
        m["restoreMs"],
        m.get("restoreLocalFiles", 0),
        m.get("restoreLocalBytes", 0),
        m.get("restoreRemoteFiles", 0),
        m.get("restoreRemoteBytes", 0),
        m.get("restoreChangelogVersions", 0),
    )


def _load_reply(result: LoadResult, started: float) -> dict[str, Any]:
    """What the JVM hears of a version made readable (load, replay)."""
    return {
        "workerRssBytes": worker_rss_bytes(),
        "manifestId": result.manifest_id,
        "numKeys": result.num_keys,
        "numInternalKeys": result.num_internal_keys,
        "bytes": result.bytes_read,
        "source": result.source,
        "loadMs": _ms(started),
        **result.metrics,
    }


def _ms(started: float) -> int:
    return int((time.perf_counter() - started) * 1000)


def _reply(fn: Callable[[], dict[str, Any]]) -> str:
    try:
        return json.dumps(fn())
    except StateStoreError as e:
        log.warning("%s", e)
        return json.dumps({"error": {"type": type(e).__name__, "message": str(e)}})
    except Exception as e:  # noqa: BLE001 - every failure must reach the JVM as a reply
        log.error("unexpected failure\n%s", traceback.format_exc())
        return json.dumps(
            {
                "error": {
                    "type": type(e).__name__,
                    "message": f"pystatestore worker error: {type(e).__name__}: {e} (see the worker log)",
                }
            }
        )
