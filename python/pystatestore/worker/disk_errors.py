"""A disk that is full or a directory this user cannot write, told as such: which of the store's
places it is (the checkpoint, or this host's local directories), the file, and what to do.

Failures reach here as OSError (our own writes, pyarrow's) or as RocksDB's errors through rocksdict
(an Exception whose text carries the system's message and the file), possibly as the cause of a
StateStoreError that already names the store and version.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from dataclasses import dataclass

from ..store.backends.context import StoreContext
from ..store.errors import DISK_FAILURE_TEXTS, StateStoreError
from ..store.local_recovery import default_root

CONF = "spark.sql.streaming.stateStore.pystatestore."
FULL = {errno.ENOSPC, errno.EDQUOT}
NOT_WRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS}
_PATH = re.compile(r"(/[^\s:'\"]+)")


@dataclass(frozen=True)
class DiskFailure:
    kind: str  # "full" or "not writable"
    reason: str  # the system's words
    path: str  # the file or directory named, "" when none was


def disk_failure(e: BaseException) -> DiskFailure | None:
    """The full disk or unwritable place behind `e` or its causes (the innermost that says so), if
    that is what it is. A path is taken from an OSError's file name or a library's text (RocksDB's
    names the file), never from our own errors' text, which names the store's directory."""
    chain: list[BaseException] = []
    while e is not None and len(chain) < 8 and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    for link in reversed(chain):
        if isinstance(link, OSError) and link.errno in FULL | NOT_WRITABLE:
            kind = "full" if link.errno in FULL else "not writable"
            return DiskFailure(kind, os.strerror(link.errno), str(link.filename or ""))
        text = str(link)
        for kind, words in DISK_FAILURE_TEXTS:
            if words in text:
                found = None if isinstance(link, StateStoreError) else _PATH.search(text)
                return DiskFailure(kind, words, found.group(1) if found else "")
    return None


def _local_path(uri: str) -> str:
    return uri[len("file:") :] if uri.startswith("file:") else uri


def _under(path: str, root: str) -> bool:
    if not path or not root:
        return False
    root = os.path.normpath(root)
    return os.path.normpath(path) == root or os.path.normpath(path).startswith(root + os.sep)


# A full disk named by no path is taken to be the store's place with less than this free.
NEARLY_FULL_BYTES = 16 << 20


def explain(failure: DiskFailure, ctx: StoreContext | None) -> str:
    """What happened and what to do, by which of the store's places `failure.path` lies in."""
    checkpoint = _local_path(ctx.store_dir) if ctx else ""
    recovery = ""
    if ctx is not None:
        recovery = ctx.options.get("localRecoveryDir") or str(default_root(ctx.host_dir))
    if failure.kind == "full" and not failure.path and ctx is not None:
        # Some writers (pyarrow's streams) name no file: the place whose disk is (nearly) full is it.
        free = {d: _free_bytes(d) for d in (ctx.host_dir, recovery, checkpoint) if d}
        full = [d for d, left in free.items() if left is not None and left < NEARLY_FULL_BYTES]
        if full:
            failure = DiskFailure(failure.kind, failure.reason, full[0])
    where = f" at {failure.path}" if failure.path else ""
    local_roots = [r for r in ((ctx.local_dir, ctx.views_dir, ctx.host_dir) if ctx else ()) if r]
    if ctx is not None and _under(failure.path, checkpoint):
        if failure.kind == "full":
            return (
                f"the checkpoint's file system is full ({failure.reason}{where}): free space there, or restart the "
                "query from a copy of its checkpoint on a larger file system"
            )
        return (
            f"the checkpoint location cannot be written ({failure.reason}{where}): make {checkpoint} writable by "
            f"the user that runs Spark's executors (uid {os.getuid()} here), or restart the query with another "
            "checkpointLocation"
        )
    if ctx is not None and (_under(failure.path, recovery) or any(_under(failure.path, r) for r in local_roots)):
        place = "local recovery directory" if _under(failure.path, recovery) else "local work directory"
        conf = f"{CONF}localRecoveryDir" if place == "local recovery directory" else "spark.local.dir"
        if failure.kind == "full":
            free = _free_bytes(failure.path)
            left = f", {free >> 20} MiB free now" if free is not None else ""
            return (
                f"this host's {place} is full ({failure.reason}{where}{left}): free space there, or set {conf} to "
                "a directory on a larger disk"
            )
        return (
            f"this host's {place} cannot be written ({failure.reason}{where}): set {conf} to a directory this "
            f"user (uid {os.getuid()}) can write"
        )
    if failure.kind == "full":
        places = [("the checkpoint", checkpoint), ("this host's local work directory", ctx.host_dir if ctx else "")]
        places.append(("its local recovery directory", recovery))
        free = [(name, d, _free_bytes(d)) for name, d in places if d]
        known = "; ".join(f"{name} {d} has {b >> 20} MiB" for name, d, b in free if b is not None)
        return (
            f"a disk is full ({failure.reason}{where}{'; free now: ' + known if known else ''}): free space there, "
            f"or set spark.local.dir (or {CONF}localRecoveryDir) to a directory on a larger disk"
        )
    return (
        f"a file cannot be written ({failure.reason}{where}): make it writable by the user that runs Spark's "
        f"executors (uid {os.getuid()} here), or point spark.local.dir or the checkpointLocation elsewhere"
    )


def _free_bytes(path: str) -> int | None:
    probe = path
    while probe and not os.path.isdir(probe):
        probe = os.path.dirname(probe)
    try:
        return shutil.disk_usage(probe or "/").free
    except OSError:
        return None
