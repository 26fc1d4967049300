"""A store as the worker holds it open: its backend, made from the JVM's description, and the lock
that serialises calls on it (a call waits a bounded time, then names the call that holds it).
Work a call leaves under the lock runs after its reply (after_reply.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..store.backends import BACKENDS, DEFAULT_BACKEND, StateBackend, StoreContext
from ..store.errors import StoreConfigError
from ..store.leases import DEFAULT_ORPHAN_GRACE_SECONDS, validate_grace
from ..store.manifest import KEY_ENCODING_RAW
from ..store.remote import RemoteStore
from . import faults
from .after_reply import AppliedOutcomes, WorkLeft

DEFAULT_CALL_TIMEOUT_MS = 30 * 60 * 1000
# A cleanup of a store that has had no commit and no snapshot since its last one is run again only
# after this long, or after the store's grace period if shorter: its plan could change only by age
# (files and chains passing the grace period) or by writers elsewhere, so what becomes deletable
# waits at most one more grace period. At a maintenance interval of 2 s and 200 partitions, cleanups
# that found nothing new were most of the worker's CPU (decision 0038).
CLEANUP_RECHECK_SECONDS = 30.0


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


class OpenStore:
    def __init__(self, backend: StateBackend) -> None:
        self.backend = backend
        self.lock = threading.Lock()
        self.busy_with: str | None = None  # the call holding the lock, for "store busy" errors
        self.busy_since = 0.0
        self.snapshotting = False  # a snapshot is being made (uploaded without the lock)
        # A call asked for a snapshot while one was being made: the maker looks again when done.
        self.snapshot_asked_meanwhile = False
        # Work a call leaves to run under the lock after it replied (a durable-first commit's apply).
        self.work_left = WorkLeft()
        # What the durable-first applies came to: views left (for awaitView), the newest one's metrics.
        self.applied = AppliedOutcomes()
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
        the worker's after-reply thread once the call calls `start_after_reply` (when its reply is
        ready, so the two do not contend for the GIL before it is sent); the store's next call waits."""
        self.work_left.leave(what, work)

    def start_after_reply(self) -> None:
        """Starts the work the calling call left under the lock; the lock is released when it ends.
        Only that call may start it (it holds the lock for the work), once, whatever its outcome: a
        call that never held the lock would start another's work, which then released it twice."""
        self.work_left.start(self.backend.ctx.store_dir, self._release)

    def _release(self) -> None:
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
        self.work_left.clear()
        try:
            yield self.backend
        finally:
            left = self.work_left.what
            if left is None:
                self._release()
            else:  # held for the work left, until start_after_reply has run it
                self.busy_with, self.busy_since = left, time.time()


def close_when_idle(store: OpenStore) -> None:
    """Closes a replaced backend once the call it may still be running (a timed-out one) returns."""

    def close() -> None:
        with store.lock:
            store.backend.close()

    threading.Thread(target=close, name="close-replaced-store", daemon=True).start()
