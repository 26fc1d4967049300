"""Restores in a process of their own. Bringing a store forward to a newly committed batch (replaying
its changes, checkpointing the local DB) holds the GIL for tens of milliseconds a batch, through
calls that do not let it go: in the process answering on an event loop, every answer waits behind
it. Here a child process owns the followers' local DBs and makes each version's checkpoint
directory; the answering process only opens it read-only (ProcessFollower).

The child is started on first use and again after it died (the next restore starts its stores from
the checkpoint); it exits when its pipe closes, so it never outlives the process that started it."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from collections import deque
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ..reading.checkpoint import StoreLocation
from ..store import errors
from ..store.errors import StateStoreError
from .layers import Changed, LayerBudget, ViewAt
from .versions import OpenVersion, Restored, StoreFollower, Tip

RESTORE_NICENESS = 10
StoreKey = tuple[str, str]  # (store uri, the follower's own name: a client may follow a store twice)


class RestoreProcess:
    """The child process and the pipe to it; one request at a time."""

    def __init__(self, scratch: str | None) -> None:
        self._scratch = tempfile.TemporaryDirectory(prefix="pystatestore-restores-", dir=scratch)
        self._lock = threading.Lock()
        self._conn: Any = None
        self._process: Any = None
        self._discarded: deque[str] = deque()  # version directories closed here, for the child to remove

    def restore(
        self, key: StoreKey, location: StoreLocation, version: int, checkpoint_id: str | None, since: ViewAt | None
    ) -> Changed | Restored | None:
        """`location` at `version` (StoreFollower.advance): the changes after `since`, or its
        checkpoint directory, schemas and manifest id; None when the store's backend keeps no
        RocksDB (it is read in this process)."""
        reply = self._ask(("restore", key, location, version, checkpoint_id, since), location, version)
        if reply[0] == "frames":
            return None
        if reply[0] == "changes":
            return reply[1]
        _, path, schemas, manifest_id = reply
        return Path(path), schemas, manifest_id

    def discard(self, path: Path) -> None:
        """Has the child remove a version directory this process closed: its unlinks would otherwise
        take turns with the answers for this process's GIL, each a switch. Sent now when the pipe
        is free, else with the next request; whatever is left goes with the scratch space."""
        self._discarded.append(str(path))
        if self._lock.acquire(blocking=False):
            try:
                self._send_discarded()
            finally:
                self._lock.release()

    def _send_discarded(self) -> None:
        """(Holding the lock.) The directories discarded so far, to a running child; no reply."""
        if self._conn is None or not self._discarded:
            return
        paths = []
        while self._discarded:  # popleft, not a swap: appends from other threads need no lock
            paths.append(self._discarded.popleft())
        try:
            self._conn.send(("discard", paths))
        except OSError:
            self._discarded.extend(paths)  # a new child removes them

    def forget(self, key: StoreKey) -> None:
        """Closes the child's follower of `key` (its local DB and scratch space)."""
        with self._lock:
            if self._conn is None:
                return
            self._send_discarded()
            try:
                self._conn.send(("forget", key))
                self._conn.recv()
            except (OSError, EOFError):
                self._lost()

    def _ask(self, request: tuple[Any, ...], location: StoreLocation, version: int) -> tuple[Any, ...]:
        with self._lock:
            if self._conn is None:
                self._start()
            self._send_discarded()
            try:
                self._conn.send(request)
                reply = self._conn.recv()
            except (OSError, EOFError):
                code = self._lost()
                raise StateStoreError(
                    f"the process restoring versions for the query's state ended (exit code {code}) while "
                    "it restored this store",
                    store=location.uri,
                    version=version,
                    advice="A new one restores it for the next batch the query commits (or the next batch=N asked); "
                    "if it keeps ending, look for the OS killing it (out of memory) in the system log.",
                ) from None
        if reply[0] == "error":
            raise _rebuilt(reply[1], location.uri)
        return reply

    def _start(self) -> None:
        # A plain child interpreter (not multiprocessing's spawn, which re-runs the asker's main
        # script), in a session of its own so a Ctrl-C at the terminal reaches only the asker,
        # which closes the pipe: the child exits when its pipe closes.
        mine, theirs = socket.socketpair()
        package_root = str(Path(__file__).resolve().parents[3])  # the directory pystatestore was imported from
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))
        self._process = subprocess.Popen(
            [sys.executable, "-m", f"{__package__}.restore_child", str(theirs.fileno()), self._scratch.name],
            pass_fds=(theirs.fileno(),),
            env=env,
            start_new_session=True,
        )
        theirs.close()
        self._conn = Connection(mine.detach())

    def _lost(self) -> int | None:
        conn, process, self._conn, self._process = self._conn, self._process, None, None
        if conn is not None:
            conn.close()
        if process is None:
            return None
        try:
            return process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            return process.wait(5)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                try:
                    self._conn.send(("exit",))
                except OSError:
                    pass
            self._lost()
        self._scratch.cleanup()


class ProcessFollower:
    """A StoreFollower whose restores run in the RestoreProcess: versions asked for in order, each
    opened here, read-only, from the checkpoint directory the child made."""

    def __init__(
        self,
        location: StoreLocation,
        restores: RestoreProcess,
        scratch: str | None,
        options_factory: Any = None,
        budget: LayerBudget | None = None,
    ) -> None:
        self.location = location
        self._restores = restores
        self._scratch = scratch
        self._options_factory = options_factory
        self._key: StoreKey = (location.uri, f"{id(self):x}")
        self._local: StoreFollower | None = None  # a store read in this process (frame backends)
        self._lock = threading.Lock()
        self._budget = budget
        self._tip = Tip(budget)
        self.version = 0

    def open(self, version: int, checkpoint_id: str | None = None) -> OpenVersion:
        with self._lock:
            if self._local is None:
                step = self._restores.restore(self._key, self.location, version, checkpoint_id, self._tip.since())
                if step is None:
                    self._local = StoreFollower(self.location, self._scratch, self._options_factory, self._budget)
            if self._local is not None:
                opened = self._local.open(version, checkpoint_id)
                self.version = version
                return opened
            self.version = version
            return self._tip.serve(self.location, version, step, self._options_factory, self._restores.discard)

    def close(self) -> None:
        with self._lock:
            self._tip.close()
            if self._local is not None:
                self._local.close()
            else:
                self._restores.forget(self._key)


# -- the child ------------------------------------------------------------------------------------
def serve_restores(conn: Any, scratch: str) -> None:
    """The child's loop: a StoreFollower per store key, restoring as asked, until told to exit or
    the pipe closes. It runs at a lower CPU priority than the process answering: a restore has the
    query's whole trigger interval, an answer a few milliseconds."""
    try:
        os.nice(RESTORE_NICENESS)
    except OSError:
        pass  # not allowed here: restores compete with answers as equals
    followers: dict[StoreKey, StoreFollower] = {}
    try:
        while True:
            try:
                request = conn.recv()
            except (EOFError, OSError):
                return
            if request[0] == "exit":
                return
            if request[0] == "discard":  # no reply: the asker does not wait for removals
                remove_discarded(request[1], scratch)
                continue
            if request[0] == "forget":
                follower = followers.pop(request[1], None)
                if follower is not None:
                    follower.close()
                conn.send(("ok",))
                continue
            _, key, location, version, checkpoint_id, since = request
            try:
                follower = followers.get(key)
                if follower is None:
                    follower = followers[key] = StoreFollower(location, scratch)
                if follower.reader.reads_frames:  # read in the asker's process: nothing kept here
                    followers.pop(key).close()
                    conn.send(("frames",))
                    continue
                step = follower.advance(version, checkpoint_id, since)
                if isinstance(step, Changed):
                    conn.send(("changes", step))
                    continue
                path, schemas, manifest_id = step
                conn.send(("ok", str(path), schemas, manifest_id))
            except Exception as e:  # noqa: BLE001 - every failure goes back to the asker, named
                conn.send(("error", _described(e)))
    finally:
        for follower in followers.values():
            follower.close()


def remove_discarded(paths: list[str], scratch: str) -> None:
    """Removes version directories the asker closed: only ones inside this child's scratch space."""
    root = Path(scratch).resolve()
    for path in paths:
        target = Path(path).resolve()
        if target != root and target.is_relative_to(root):
            shutil.rmtree(target, ignore_errors=True)


def _described(e: Exception) -> dict[str, Any]:
    if isinstance(e, StateStoreError):
        return {
            "type": type(e).__name__,
            "problem": e.problem,
            "store": e.store,
            "version": e.version,
            "file": e.file,
            "advice": e.advice,
        }
    if isinstance(e, OSError):
        return {"type": "OSError", "errno": e.errno, "text": str(e)}
    return {"type": "crash", "text": "".join(traceback.format_exception(e))}


def _rebuilt(described: dict[str, Any], store: str) -> Exception:
    """The child's error, raised here as the same class with the same fields."""
    kind = described["type"]
    if kind == "OSError":
        return OSError(described["errno"], described["text"])
    if kind == "crash":
        return StateStoreError(
            f"restoring the store failed unexpectedly: {described['text']}",
            store=store,
            advice="Report this with the trace above.",
        )
    cls = getattr(errors, kind, None)
    if not (isinstance(cls, type) and issubclass(cls, StateStoreError)):
        cls = StateStoreError
    return cls(
        described["problem"],
        store=described["store"],
        version=described["version"],
        file=described["file"],
        advice=described["advice"],
    )


__all__ = ["ProcessFollower", "RestoreProcess", "serve_restores"]
