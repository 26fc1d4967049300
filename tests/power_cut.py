"""A power cut at any step of a store's history, after SQLite's crash-test VFS and the ALICE and
CrashMonkey studies of crash consistency.

`RecordingDisk` takes the place of `pystatestore.store.local_disk.DISK` while a history runs: every
write, create, rename, link, removal and fsync the store makes under a root directory happens for
real and is also written down, with the bytes. `crash_image` then says what a disk would hold had
the power gone after any event of that log, by the rules filesystems keep (and no more):
- a file's bytes are on disk up to its last fsync; what was written after may be there, in part
  (a torn tail) or not at all;
- a name (a create, rename, hard link, new directory, removal) is on disk once the directory
  holding it was fsynced after the change (both directories for a rename between two); of the
  others, some survive: a first part, in the order they were made (`mixed`: a journal's order),
  or any of them (`subset`: a filesystem that writes names back in its own order); a rename
  happens whole or not at all, and a name in a directory that did not survive is gone with it;
- a hard link from outside the root brings bytes RocksDB has fsynced (a checkpoint's SST); a file
  renamed in from outside brings bytes nobody fsynced; directories another process made
  (`mkdirs_unsynced`: Spark's `state/<op>/`) are names nobody synced.
Each image is one of four kinds: `lost` (everything not synced is gone: empty files, no names),
`kept` (everything is there: what a killed process leaves), `mixed` and `subset` (which unsynced
names survive as above, and for each file whether its unsynced bytes are gone, torn or whole, drawn
from a seeded generator). A log may start from a disk that already holds files (`base`: the image
of an earlier cut, which a restart then writes over), all of it durable.

A point an fsync names can be left out (`off`): the log then shows no fsync there, so the images
are those of a product without that fsync. This file imports nothing of the product's storage code
but the disk it stands in for.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import random
import shutil
import threading
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from pystatestore.store.local_disk import LocalDisk

DIR = None  # an image's value for a directory
KINDS = ("lost", "kept", "mixed", "subset")


@dataclass(frozen=True)
class Event:
    op: str  # mkdir create data fsync dirsync rename link unlink rmdir ack
    path: str = ""  # relative to the root ("" for the root itself)
    other: str = ""  # rename/link target
    inode: int = -1
    data: bytes = b""
    point: str = ""
    ack: Any = None  # what the test attached to an "ack"


class _RecordedFile:
    """A file opened through the recording disk: its writes are logged, bytes and all."""

    def __init__(self, disk: RecordingDisk, raw: BinaryIO, inode: int) -> None:
        self._disk, self._raw, self.inode = disk, raw, inode
        self._content = bytearray()

    def write(self, data: Any) -> int:
        n = self._raw.write(data)
        self._content += bytes(data)
        self._disk._log(Event("data", inode=self.inode, data=bytes(self._content)))
        return n

    def flush(self) -> None:
        self._raw.flush()

    def fileno(self) -> int:
        return self._raw.fileno()

    def close(self) -> None:
        self._raw.close()

    def __enter__(self) -> _RecordedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RecordingDisk(LocalDisk):
    """The real disk, with every change under `root` written down (see the module's docstring)."""

    def __init__(self, root: Path, off: Iterable[str] = (), base: Mapping[str, bytes | None] | None = None) -> None:
        """`base`: what `root` holds already (an earlier cut's image, as `crash_image` is given it)."""
        super().__init__()
        self.root = os.path.realpath(root)
        self.off = frozenset(off)
        self.events: list[Event] = []
        self.points: set[str] = set()  # every point an fsync named, left out or not
        self._inodes: dict[str, int] = base_inodes(base or {})  # path under the root -> inode, as the log has it
        self._next_inode = itertools.count()
        self._lock = threading.RLock()  # uploads run on several threads

    def _rel(self, path: str | os.PathLike[str]) -> str | None:
        real = os.path.join(os.path.realpath(os.path.dirname(os.fspath(path))), os.path.basename(os.fspath(path)))
        if real == self.root:
            return ""
        return os.path.relpath(real, self.root) if real.startswith(self.root + os.sep) else None

    def _log(self, event: Event) -> None:
        self.events.append(event)

    def ack(self, what: Any) -> None:
        """Marks the log: what came before this returned to its caller (a commit's reply)."""
        with self._lock:
            self._log(Event("ack", ack=what))

    def mkdirs_unsynced(self, path: Path) -> None:
        """What another process does that makes directories the way Hadoop's local filesystem
        does (Spark's checkpoint, `state/` and `state/<op>/`): every missing one made, none synced."""
        with self._lock:
            missing = []
            p = Path(path)
            while not p.exists():
                missing.append(p)
                p = p.parent
            for d in reversed(missing):
                d.mkdir()
                rel = self._rel(d)
                if rel is not None:
                    self._log(Event("mkdir", path=rel))

    # -- the disk's operations -------------------------------------------------------------
    def sync_file(self, file: BinaryIO, point: str) -> None:
        with self._lock:
            super().sync_file(file, point)
            self.points.add(point)
            if isinstance(file, _RecordedFile) and point not in self.off:
                self._log(Event("fsync", inode=file.inode, point=point))

    def sync_path(self, path: str, point: str) -> None:
        with self._lock:
            super().sync_path(path, point)
            self.points.add(point)
            rel = self._rel(path)
            if rel is not None and rel in self._inodes and point not in self.off:
                self._log(Event("fsync", inode=self._inodes[rel], point=point))

    def sync_dir(self, path: str, point: str) -> None:
        with self._lock:
            super().sync_dir(path, point)
            self.points.add(point)
            rel = self._rel(path)
            if rel is not None and point not in self.off:
                self._log(Event("dirsync", path=rel, point=point))

    def open_new(self, path: str, *, exclusive: bool = False) -> Any:
        with self._lock:
            raw = super().open_new(path, exclusive=exclusive)
            rel = self._rel(path)
            if rel is None:
                return raw
            inode = self._inodes.get(rel)
            if inode is None:
                inode = next(self._next_inode)
                self._inodes[rel] = inode
                self._log(Event("create", path=rel, inode=inode))
            else:  # truncated in place: the same file, its bytes gone
                self._log(Event("data", inode=inode, data=b""))
            return _RecordedFile(self, raw, inode)

    def mkdir(self, path: str, mode: int = 0o777) -> None:
        with self._lock:
            super().mkdir(path, mode)
            rel = self._rel(path)
            if rel is not None:
                self._log(Event("mkdir", path=rel))

    def rename(self, src: str, dst: str) -> None:
        with self._lock:
            super().rename(src, dst)
            rel_src, rel_dst = self._rel(src), self._rel(dst)
            if rel_dst is None:
                if rel_src is not None:
                    self._forget(rel_src)
                    self._log(Event("unlink", path=rel_src))
                return
            if rel_src is not None:
                self._move(rel_src, rel_dst)
                self._log(Event("rename", path=rel_src, other=rel_dst))
                return
            self._bring_in(rel_dst, Path(dst).read_bytes(), synced=False)

    def link(self, src: str, dst: str) -> None:
        with self._lock:
            super().link(src, dst)
            rel_src, rel_dst = self._rel(src), self._rel(dst)
            if rel_dst is None:
                return
            if rel_src is not None and rel_src in self._inodes:
                self._inodes[rel_dst] = self._inodes[rel_src]
                self._log(Event("link", path=rel_src, other=rel_dst))
                return
            self._bring_in(rel_dst, Path(dst).read_bytes(), synced=True)

    def unlink(self, path: str) -> None:
        with self._lock:
            super().unlink(path)
            rel = self._rel(path)
            if rel is not None:
                self._forget(rel)
                self._log(Event("unlink", path=rel))

    def rmdir(self, path: str) -> None:
        with self._lock:
            super().rmdir(path)
            rel = self._rel(path)
            if rel is not None:
                self._log(Event("rmdir", path=rel))

    # -- bookkeeping ------------------------------------------------------------------------
    def _bring_in(self, rel: str, data: bytes, *, synced: bool) -> None:
        inode = next(self._next_inode)
        self._inodes[rel] = inode
        self._log(Event("create", path=rel, inode=inode))
        self._log(Event("data", inode=inode, data=data))
        if synced:
            self._log(Event("fsync", inode=inode, point="outside"))

    def _forget(self, rel: str) -> None:
        self._inodes.pop(rel, None)

    def _move(self, src: str, dst: str) -> None:
        for path in [p for p in self._inodes if p == src or p.startswith(src + "/")]:
            self._inodes[dst + path[len(src) :]] = self._inodes.pop(path)


@dataclass
class Image:
    """What the disk holds after a cut: path -> bytes (files) or None (directories)."""

    tree: dict[str, bytes | None] = field(default_factory=dict)
    acks: list[Any] = field(default_factory=list)  # every ack logged before the cut

    def signature(self) -> str:
        digest = hashlib.sha256()
        for path in sorted(self.tree):
            content = self.tree[path]
            digest.update(path.encode() + b"\0" + (b"/" if content is None else hashlib.sha256(content).digest()))
        return digest.hexdigest()

    def materialize(self, root: Path, age_seconds: float = 86400.0) -> None:
        """Empties `root` and writes the image there, every file and directory last modified
        `age_seconds` ago: the power came back after a while, and the history's clock ran ahead
        of the real one (its garbage collection judged ages past the grace)."""
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        then = time.time() - age_seconds
        for path in sorted(self.tree, key=lambda p: (p.count("/"), p)):
            target = root / path
            content = self.tree[path]
            if content is None:
                target.mkdir(exist_ok=True)
            else:
                target.write_bytes(content)
        for path in sorted(self.tree, key=lambda p: -p.count("/")):  # children first: writes touch parents
            os.utime(root / path, (then, then))


def _parents(event: Event) -> list[str]:
    """The directories whose fsync makes this event's names durable."""
    if event.op in ("rename", "link"):
        return sorted({os.path.dirname(event.path), os.path.dirname(event.other)})
    return [os.path.dirname(event.path)]


NAME_OPS = ("mkdir", "create", "rename", "link", "unlink", "rmdir")


def base_inodes(base: Mapping[str, bytes | None]) -> dict[str, int]:
    """The inodes the files of a starting disk get (negative: a log counts its own up from 0)."""
    return {path: -1 - i for i, path in enumerate(sorted(p for p, c in base.items() if c is not None))}


def pending_names(events: list[Event], cut: int) -> list[int]:
    """The indices of the name operations of `events[:cut]` that no directory fsync made durable
    (a name is durable once every directory holding it was fsynced after it)."""
    last_sync: dict[str, int] = {}
    for i, e in enumerate(events[:cut]):
        if e.op == "dirsync":
            last_sync[e.path] = i
    return [
        i for i, e in enumerate(events[:cut]) if e.op in NAME_OPS and any(last_sync.get(d, -1) < i for d in _parents(e))
    ]


def crash_image(
    events: list[Event],
    cut: int,
    kind: str,
    rng: random.Random | None = None,
    *,
    base: Mapping[str, bytes | None] | None = None,
    surviving: Collection[int] | None = None,
) -> Image:
    """The disk after a power cut following `events[:cut]` (see the module's docstring), on a disk
    that held `base` before the first event. `surviving` names the unsynced name operations that
    survive (indices into `events`), instead of `kind`'s rule; file bytes still follow `kind`."""
    happened = events[:cut]
    pending = pending_names(events, cut)
    if surviving is not None:
        chosen = set(surviving)
    elif kind == "kept":
        chosen = set(pending)
    elif kind == "lost":
        chosen = set()
    elif kind == "mixed":  # a journal writes names back in the order they were made
        assert rng is not None
        chosen = set(pending[: rng.randint(0, len(pending))])
    elif kind == "subset":  # any of them, each with a chance drawn for the image (all, few, none)
        assert rng is not None
        chance = rng.random()
        chosen = {i for i in pending if rng.random() < chance}
    else:
        raise ValueError(f"unknown image kind {kind!r}")
    dropped = set(pending) - chosen

    start = base or {}
    inodes = base_inodes(start)
    tree: dict[str, int | None] = {"": None}  # path -> inode, or None for a directory
    tree.update({p: (None if c is None else inodes[p]) for p, c in start.items()})
    current: dict[int, bytes] = {inodes[p]: c for p, c in start.items() if c is not None}
    synced: dict[int, bytes] = dict(current)
    image = Image()
    for i, e in enumerate(happened):
        if e.op == "data":
            current[e.inode] = e.data
        elif e.op == "fsync":
            synced[e.inode] = current.get(e.inode, b"")
        elif e.op == "ack":
            image.acks.append(e.ack)
        elif e.op in NAME_OPS and i not in dropped:
            _apply_name_op(tree, e)
    for path, inode in tree.items():
        if path == "":
            continue
        if inode is None:
            image.tree[path] = DIR
            continue
        now, kept = current.get(inode, b""), synced.get(inode, b"")
        if kind == "kept" or now == kept:
            image.tree[path] = now
        elif kind == "lost":
            image.tree[path] = kept
        else:
            assert rng is not None
            choice = rng.randrange(3)
            if choice == 0:
                image.tree[path] = kept
            elif choice == 1:
                image.tree[path] = now
            else:  # a torn tail: what was synced, and part of what came after
                image.tree[path] = now[: rng.randint(len(kept), max(len(kept), len(now) - 1))]
    return image


def _apply_name_op(tree: dict[str, int | None], e: Event) -> None:
    parent = os.path.dirname(e.path)
    if e.op == "mkdir":
        if parent in tree and tree[parent] is None and e.path not in tree:
            tree[e.path] = None
    elif e.op == "create":
        if parent in tree and tree[parent] is None:
            tree[e.path] = e.inode
    elif e.op == "link":
        target_parent = os.path.dirname(e.other)
        if tree.get(e.path, DIR) is not None and target_parent in tree and tree[target_parent] is None:
            tree[e.other] = tree[e.path]
    elif e.op == "rename":
        target_parent = os.path.dirname(e.other)
        if e.path not in tree or target_parent not in tree or tree[target_parent] is not None:
            return
        moved = {p: v for p, v in tree.items() if p == e.path or p.startswith(e.path + "/")}
        for p in moved:
            del tree[p]
        for p, v in moved.items():
            tree[e.other + p[len(e.path) :]] = v
    elif e.op == "unlink":
        if tree.get(e.path, DIR) is not None:
            tree.pop(e.path, None)
    elif e.op == "rmdir":
        if e.path in tree and tree[e.path] is None and not any(p.startswith(e.path + "/") for p in tree):
            del tree[e.path]


def disk_tree(root: Path) -> dict[str, bytes | None]:
    """What `root` holds now, as an image's tree (symbolic links left out)."""
    out: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for d in dirnames:
            out[os.path.normpath(os.path.join(rel, d))] = DIR
        for f in filenames:
            path = os.path.join(dirpath, f)
            if not os.path.islink(path):
                out[os.path.normpath(os.path.join(rel, f))] = Path(path).read_bytes()
    return out
