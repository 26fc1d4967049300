"""The Spark-facing service: the object the JVM shim calls over Py4J (PythonStateService).

It maps store handles to open stores (open_store.py: a backend and the lock that serialises calls
on it), runs each call under its store's lock, and turns every outcome into a JSON reply
(replies.py). A durable-first commit replies once its version is durable and leaves the rest to run
after the reply (after_reply.py).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any

import pyarrow as pa

from ..release import __version__
from ..store import frames
from ..store.backends import BACKENDS
from ..store.backends.context import StoreContext, elapsed_ms
from ..store.errors import StateStoreError, StoreConfigError
from .after_reply import apply_after_reply
from .memory_use import release_free_memory, worker_rss_bytes
from .open_store import OpenStore, close_when_idle, context_from_description, make_backend
from .replies import load_reply, log_restore, reply

PROTOCOL_VERSION = 9
MAINTENANCE_PARTS = ("snapshot", "cleanup")
CLOSE_WAIT_SECONDS = 10.0  # a close waits this long for a call in flight, then closes when it returns
log = logging.getLogger("pystatestore.service")


class StoreService:
    """Implements org.pystatestore.PythonStateService for the JVM."""

    class Java:
        implements = ["org.pystatestore.PythonStateService"]

    def __init__(self) -> None:
        self._stores: dict[str, OpenStore] = {}
        self._lock = threading.Lock()

    # -- protocol ----------------------------------------------------------------------------
    def hello(self) -> str:
        return reply(
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
            replaced: list[OpenStore] = []
            with self._lock:
                existing = self._stores.get(handle)
                if existing is None or existing.backend.ctx != ctx:
                    if existing is not None:
                        replaced.append(existing)
                    self._stores[handle] = OpenStore(make_backend(ctx))
                gone = desc.get("replacesHandle")
                if gone and gone != handle and gone in self._stores:
                    replaced.append(self._stores.pop(gone))
            for store in replaced:
                close_when_idle(store)
            backend = self._stores[handle].backend
            return {"handle": handle, "readPath": backend.read_path, "keyEncoding": ctx.key_encoding}

        return reply(run, store=lambda: context_from_description(json.loads(store_json)), doing="opening")

    def load(self, handle: str, version: int, checkpoint_id: str, out_path: str, view_dir: str) -> str:
        """Makes `version` (its attempt `checkpoint_id`, unless "") readable by the JVM: a state frame
        at `out_path`, or (view backends) a read view at `view_dir`."""

        def run() -> dict[str, Any]:
            started = time.perf_counter()
            with self._store(handle).locked(f"load of version {version}", handle) as backend:
                result = backend.load(int(version), view_dir or None, str(checkpoint_id) or None)
            log_restore(handle, int(version), result)
            if result.frame is not None:
                frames.write_buffer(out_path, result.frame)
            return load_reply(result, started)

        return reply(run, store=lambda: self._context(handle), doing=f"load of version {version}")

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

        left_work: list[OpenStore] = []  # the store, once this call left work under its lock

        def run() -> dict[str, Any]:
            started = time.perf_counter()
            store = self._store(handle)
            version = int(base_version) + 1
            with (
                frames.open_changes(changes_path) as changes,
                store.locked(f"commit of version {version}", handle) as backend,
            ):
                previous_apply, store.applied.metrics = store.applied.metrics, {}
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
                        apply_after_reply(store.applied, handle, version, view_dir, result.finish),
                    )
                    left_work.append(store)  # this call holds the lock for it: it starts it, no other
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
                "commitMs": elapsed_ms(started),
                **previous_apply,
                **result.metrics,
                **({"viewPending": True} if result.finish is not None else {}),
            }

        try:
            return reply(run, store=lambda: self._context(handle), doing=f"commit of version {int(base_version) + 1}")
        finally:
            for store in left_work:
                store.start_after_reply()

    def awaitView(self, handle: str, version: int, manifest_id: str, view_dir: str) -> str:  # noqa: N802
        """Returns once the read view of `version` (the attempt `manifest_id`) a durable-first commit
        left to its apply is at `view_dir`: at once if the apply left it, after a load of the version
        from the checkpoint if the apply failed or this worker never ran it (the one that did died)."""

        def run() -> dict[str, Any]:
            started = time.perf_counter()
            store = self._store(handle)
            with store.locked(f"read view of version {version}", handle) as backend:
                waited = elapsed_ms(started)
                if store.applied.views.pop(view_dir, False):
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
            log_restore(handle, int(version), result)
            return {**load_reply(result, started), "viewLeftByApply": False, "viewWaitMs": waited}

        return reply(run, store=lambda: self._context(handle), doing=f"read view of version {version}")

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

        return reply(run, store=lambda: self._context(handle), doing="maintenance")

    def _snapshot(self, store: OpenStore, handle: str, *, force: bool) -> dict[str, Any]:
        """A snapshot of the newest changelog version if one is due (or `force`d). It is set up (hard
        links) under the store's lock but uploaded without it, so commits never wait for an upload.
        A call that finds one being made leaves it to the maker, which looks again once done: the
        commits during an upload (a fast-growing state's next version) get their snapshot then,
        not at the next periodic maintenance, which may never come before the query stops."""
        report: dict[str, Any] = {}
        while True:
            with store.locked("maintenance (preparing a snapshot)", handle) as backend:
                if store.snapshotting and not force:
                    store.snapshot_asked_meanwhile = True
                    return report  # another call is making one, and looks again when done
                store.snapshot_asked_meanwhile = False
                job = backend.prepare_materialization(force=force)
                if job is not None:
                    store.snapshotting = True
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
                return report
            finally:
                with store.locked("maintenance (recording a snapshot)", handle):
                    backend.complete_materialization(job)
                    store.snapshotting = False
                    store.changed_since_cleanup = True  # older chains may have become garbage
                    # Only a commit during the upload can have made a new one due: a request for
                    # the version just snapshotted (Spark's periodic maintenance) needs no second look.
                    again = store.snapshot_asked_meanwhile and backend.snapshot_due()
            report.update(getattr(job, "metrics", {}))
            if not again:
                return report
            force = False

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

        return reply(run, store=lambda: self._context(handle), doing="change feed")

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
            log_restore(handle, int(end_version), result)
            return load_reply(result, started)

        return reply(run, store=lambda: self._context(handle), doing=f"replay to version {end_version}")

    def closeStore(self, handle: str, wait_seconds: float = CLOSE_WAIT_SECONDS) -> str:  # noqa: N802
        """Closes a store now, or, if a call (a stuck one) still holds it, as soon as that returns:
        once it is out of the map nothing else would ever close it."""

        def run() -> dict[str, Any]:
            with self._lock:
                store = self._stores.pop(handle, None)
            if store is None:
                return {"closed": False}
            if not store.lock.acquire(timeout=wait_seconds):
                close_when_idle(store)
                return {"closed": True, "deferred": True}
            try:
                store.backend.close()
            finally:
                store.lock.release()
            return {"closed": True}

        return reply(run, store=lambda: self._context(handle), doing="close")

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
    def _context(self, handle: str) -> StoreContext | None:
        """The store's description, if it is open here (for naming it in errors)."""
        with self._lock:
            store = self._stores.get(handle)
        return store.backend.ctx if store is not None else None

    def _store(self, handle: str) -> OpenStore:
        with self._lock:
            store = self._stores.get(handle)
        if store is None:
            raise StoreConfigError("store is not open in this worker (the JVM must call openStore first)", store=handle)
        return store
