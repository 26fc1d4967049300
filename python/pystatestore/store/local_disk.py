"""Writes to local and mounted filesystems that survive a power cut.

A file's bytes are on disk once the file is fsynced; its name (a create, a rename, a hard link, a
new directory) once the directory holding the name is fsynced after the change. Filesystems keep
both in memory until then and write them back in any order (ext4 and XFS do), so a commit that
renamed its manifest into place but was not fsynced can come back after a power cut as no manifest,
an empty one, or half of one. Every write the store makes on a local disk (the checkpoint's files
when it is a `file:` location, and the host's local recovery copies) goes through `DISK`, in this
order: data written and fsynced, then the directory that names it fsynced, before anything refers
to the name (a manifest to its files, a reply to its manifest, a marker to its copy).

Each fsync names its *point* (what it makes durable). `tests/test_power_cut.py` puts a recording
disk in `DISK`'s place, replays every write of a history, cuts the power after any step and takes
out one point at a time to show which ones a restart needs. On object stores none of this applies:
a completed PUT is the durability point (`remote.RemoteStore`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections import OrderedDict
from typing import BinaryIO

# How many directories `make_dirs` remembers as durable: every store's few, with room for the
# attempt directories commits make once each (least recently used forgotten first: a directory
# forgotten is synced once more, nothing else).
DURABLE_NAMES_KEPT = 8192


class LocalDisk:
    """The real disk: each method is the system call it names, then the fsyncs that make it last."""

    def __init__(self) -> None:
        # (path, device, inode) of the directories whose names this process made durable in their
        # parents (`make_dirs`): synced once, not on every commit.
        self._durable_names: OrderedDict[tuple[str, int, int], None] = OrderedDict()
        self._names_lock = threading.Lock()  # uploads call make_dirs from several threads

    def sync_file(self, file: BinaryIO, point: str) -> None:
        """Flushes `file` (open for writing) and fsyncs its data."""
        file.flush()
        os.fsync(file.fileno())

    def sync_dir(self, path: str, point: str) -> None:
        """Fsyncs directory `path`: names created, renamed or removed in it are on disk afterwards."""
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def open_new(self, path: str, *, exclusive: bool = False) -> BinaryIO:
        """A file to write (created, or truncated unless `exclusive`); the caller syncs it."""
        return open(path, "xb" if exclusive else "wb")  # the caller closes it

    def write(self, path: str, data: bytes | bytearray | memoryview, point: str | None) -> None:
        """Writes `path` whole and fsyncs its data (not its name: see `sync_dir`); with no `point`,
        leaves it to the filesystem (a file whose loss or tearing is detected where it is read)."""
        with self.open_new(path) as out:
            out.write(data)
            if point is not None:
                self.sync_file(out, point)

    def copy_file(self, src: str, dst: str, point: str | None = None) -> None:
        """Copies `src`'s bytes to a new `dst`, its data fsynced at `point` (with none, unsynced:
        see `write`)."""
        with open(src, "rb") as source, self.open_new(dst, exclusive=True) as out:
            shutil.copyfileobj(source, out, 1 << 20)
            if point is not None:
                self.sync_file(out, point)

    def sync_path(self, path: str, point: str) -> None:
        """Fsyncs the data of the existing file `path`, which another process wrote (a JVM)."""
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def mkdir(self, path: str, mode: int = 0o777) -> None:
        """One new directory, its name unsynced (see `make_dirs` for durable ones)."""
        os.mkdir(path, mode)

    def make_dirs(self, path: str, point: str, *, root: str, mode: int = 0o777) -> list[str]:
        """Makes directory `path` and every directory from `root` down to it durable: each missing
        one is created and synced into its parent before the next is created in it; each that
        already exists has its name synced into its parent too, once per process, since whoever
        made it may never have (Spark makes a checkpoint's `state/` and `state/<op>/` with no
        fsync, and a killed attempt can leave one made but unsynced). `root`'s own name counts:
        a checkpoint whose directory a power cut takes loses every store in it. Directories
        above `root` are created where missing and otherwise left alone. Returns the directories
        created (outermost first)."""
        target, top = os.path.normpath(path), os.path.normpath(root)
        if target != top and not target.startswith(top.rstrip(os.sep) + os.sep):
            raise ValueError(f"{path!r} is not below {root!r}")
        chain = [target]
        while chain[-1] != top:
            chain.append(os.path.dirname(chain[-1]))
        above = os.path.dirname(top)
        while above != os.path.dirname(above) and not os.path.lexists(above):
            chain.append(above)  # missing above the root: created, and so synced, like the rest
            above = os.path.dirname(above)
        created = []
        for d in reversed(chain):
            try:
                st = os.stat(d)
            except FileNotFoundError:
                try:
                    self.mkdir(d, mode)
                    created.append(d)
                except FileExistsError:
                    pass  # made meanwhile by another writer: synced below unless it already did
                st = os.stat(d)
            key = (d, st.st_dev, st.st_ino)  # a directory removed and made again is a new one
            if self._known_durable(key):
                continue
            try:
                self.sync_dir(os.path.dirname(d), point)
            except PermissionError:
                if d in created or d != top:
                    raise
                # The root's parent may be one the query cannot read (a mount point of mode 0711):
                # its name is as durable as whoever made it left it, and nothing here can do better.
            with self._names_lock:
                self._durable_names[key] = None
                if len(self._durable_names) > DURABLE_NAMES_KEPT:
                    self._durable_names.popitem(last=False)
        return created

    def _known_durable(self, key: tuple[str, int, int]) -> bool:
        with self._names_lock:
            if key not in self._durable_names:
                return False
            self._durable_names.move_to_end(key)
            return True

    def replace(self, src: str, dst: str, point: str) -> None:
        """rename(2) of `src` over `dst`, atomic; durable once this returns."""
        self.rename(src, dst)
        self.sync_dir(os.path.dirname(dst), point)
        if os.path.dirname(src) != os.path.dirname(dst):
            self.sync_dir(os.path.dirname(src), point)

    def rename(self, src: str, dst: str) -> None:
        """rename(2), unsynced: for files whose loss is detected where they are read."""
        os.replace(src, dst)

    def link(self, src: str, dst: str) -> None:
        """A hard link, unsynced (`sync_dir` its directory to make it durable)."""
        os.link(src, dst)

    def unlink(self, path: str) -> None:
        """Removes a name. A removal that a power cut undoes leaves a file nothing refers to (or a
        copy that no marker vouches for), which the next clean-up removes again, so removals are
        not synced."""
        os.unlink(path)

    def rmdir(self, path: str) -> None:
        os.rmdir(path)

    def remove_tree(self, path: str) -> None:
        """Removes directory `path` and everything below it, as far as it can, never following a
        symbolic link (one is removed as a name, like a file); unsynced, like `unlink`."""
        try:
            if os.path.islink(path) or not os.path.isdir(path):
                return
            entries = list(os.scandir(path))
        except OSError:
            return
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                self.remove_tree(entry.path)
            else:
                with contextlib.suppress(OSError):
                    self.unlink(entry.path)
        with contextlib.suppress(OSError):
            self.rmdir(path)


DISK = LocalDisk()
