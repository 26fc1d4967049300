"""Work a call leaves to run after its reply, under its store's lock (decision 0032): a
durable-first commit replies once its version is durable, and applying it to the local DB (which
leaves the JVM's read view) runs afterwards, on one `after-reply` thread per worker.

A call leaves the work in its store's WorkLeft while it holds the lock (OpenStore.run_after_reply);
once its reply is built that call, and no other, starts the work (OpenStore.start_after_reply), and
the lock is released when the work ends, however it ends. What each apply came to is kept in the
store's AppliedOutcomes: `awaitView` asks whether a view was left, the next commit's reply carries
the metrics.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from ..store.backends.context import elapsed_ms
from .memory_use import release_free_memory

log = logging.getLogger("pystatestore.service")

# How many outcomes of durable-first applies a store remembers for `awaitView`: a view the JVM
# never reads before it is evicted from its cache is never asked about.
APPLIED_VIEWS_KEPT = 16


class AfterReplyThread:
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
            job = self._jobs.get()
            try:
                job()  # logs its own failures and releases its store
            except BaseException:  # noqa: BLE001 - every later job of the worker waits on this thread
                log.error("unexpected failure on the after-reply thread\n%s", traceback.format_exc())


_after_reply = AfterReplyThread()


class WorkLeft:
    """The work one call left to run under its store's lock after its reply, if any. Only the
    thread holding the store's lock touches it: the call that leaves it, then starts it."""

    def __init__(self) -> None:
        self._left: tuple[str, Callable[[], None]] | None = None

    @property
    def what(self) -> str | None:
        """What the work left is (it holds the store for that), or None."""
        return self._left[0] if self._left is not None else None

    def leave(self, what: str, work: Callable[[], None]) -> None:
        self._left = (what, work)

    def clear(self) -> None:
        self._left = None

    def start(self, store: str, release: Callable[[], None]) -> None:
        """Runs the work left (none: nothing to do) on the after-reply thread, then `release`s the store."""
        left, self._left = self._left, None
        if left is not None:
            what, work = left
            _after_reply.submit(lambda: _run_then_release(store, what, work, release))


def _run_then_release(store: str, what: str, work: Callable[[], None], release: Callable[[], None]) -> None:
    try:
        work()
    except BaseException:  # noqa: BLE001 - the work records its own outcome; never leave the lock held
        log.error("store %s: unexpected failure %s\n%s", store, what, traceback.format_exc())
    finally:
        release()


@dataclass
class AppliedOutcomes:
    """What a store's durable-first applies came to."""

    # View directory -> whether the apply that was to leave it did (newest last).
    views: OrderedDict[str, bool] = field(default_factory=OrderedDict)
    # The metrics of the newest apply that ran after its commit replied, for the next commit's reply.
    metrics: dict[str, int] = field(default_factory=dict)


def apply_after_reply(
    outcomes: AppliedOutcomes, handle: str, version: int, view_dir: str, finish: Callable[[], dict[str, int]]
) -> Callable[[], None]:
    """A durable-first commit's apply, run after its reply under the store's lock: its outcome is
    what `awaitView` finds for `view_dir`, its metrics go with the store's next commit."""

    def apply() -> None:
        started = time.perf_counter()
        ok = False
        metrics = {"applyFailures": 1}
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
        finally:  # also when what it raised is no Exception (the after-reply thread logs that)
            # A view, once made, is whole (the JVM may already read it) even if the apply failed after it.
            outcomes.views[view_dir] = ok or os.path.isdir(view_dir)
            while len(outcomes.views) > APPLIED_VIEWS_KEPT:
                outcomes.views.popitem(last=False)
            outcomes.metrics = {**metrics, "deferredApplyMs": elapsed_ms(started)}
        release_free_memory()

    return apply
