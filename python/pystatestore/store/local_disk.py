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
from typing import BinaryIO


class LocalDisk:
    """The real disk: each method is the system call it names, then the fsyncs that make it last."""

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

    def copy_file(self, src: str, dst: str) -> None:
        """Copies `src`'s bytes to a new `dst`, unsynced (see `write` with no point)."""
        with open(src, "rb") as source, self.open_new(dst, exclusive=True) as out:
            shutil.copyfileobj(source, out, 1 << 20)

    def mkdir(self, path: str, mode: int = 0o777) -> None:
        """One new directory, its name unsynced (see `make_dirs` for durable ones)."""
        os.mkdir(path, mode)

    def make_dirs(self, path: str, point: str, *, mode: int = 0o777) -> list[str]:
        """Creates `path` and its missing parents, each made durable in its parent before the next
        is created in it; returns the directories created (outermost first)."""
        missing = []
        p = os.path.normpath(path)
        while not os.path.lexists(p):
            missing.append(p)
            parent = os.path.dirname(p)
            if parent == p:
                break
            p = parent
        created = []
        for d in reversed(missing):
            try:
                self.mkdir(d, mode)
            except FileExistsError:
                continue  # made meanwhile by another writer, who makes it durable
            self.sync_dir(os.path.dirname(d), point)
            created.append(d)
        return created

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
