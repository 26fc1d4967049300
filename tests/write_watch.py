"""Every write to a set of files, by any process and under any name: Linux inotify watches on the
files themselves. A watch on a file is a watch on its inode, so a write through a hard link in
another directory (the local DB, a view, a local recovery copy) is reported as a write to the
watched file; the kernel reports it from the writer's own system call, whether Python, RocksDB's
threads or another process made it. Reported: a file opened for writing and closed (IN_CLOSE_WRITE,
also when nothing was written) and every write or truncation (IN_MODIFY). A rename over a name or
an unlink changes no file's bytes and is not reported.

Not a product module: the tests that prove nothing writes into a checkpoint's files use it
(tests/test_linked_restores.py), and share nothing else with what they judge."""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

IN_MODIFY = 0x00000002
IN_CLOSE_WRITE = 0x00000008
IN_IGNORED = 0x00008000
IN_Q_OVERFLOW = 0x00004000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then the name)

AVAILABLE = sys.platform.startswith("linux")


@dataclass(frozen=True)
class Write:
    path: Path  # the watched name (the file may have been written through another one)
    what: str  # "opened for writing" or "written"


class WriteWatch:
    """Watches files for writes from `watch` on; `writes()` returns what happened since."""

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self._fd = fd
        self._paths: dict[int, Path] = {}
        self._seen: list[Write] = []
        self.overflowed = False

    def watch(self, path: Path) -> bool:
        """Watches `path`'s inode (a file already watched under another name keeps its watch: the
        kernel gives one per inode); False when it is gone."""
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(path), IN_MODIFY | IN_CLOSE_WRITE)
        if wd < 0:
            err = ctypes.get_errno()
            if err == errno.ENOENT:
                return False
            raise OSError(err, f"inotify_add_watch {path}")
        self._paths.setdefault(wd, path)
        return True

    def writes(self) -> list[Write]:
        """Every write reported so far; not all of them once `overflowed` (the kernel's queue was full
        and it dropped some), which a caller must treat as a failure."""
        while True:
            try:
                data = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                break
            offset = 0
            while offset < len(data):
                wd, mask, _, length = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size + length
                if mask & IN_Q_OVERFLOW:
                    self.overflowed = True
                if mask & IN_IGNORED:  # its last name was removed: GC may delete, which is no write
                    continue
                path = self._paths.get(wd, Path(f"<watch {wd}>"))
                if mask & IN_MODIFY:
                    self._seen.append(Write(path, "written"))
                if mask & IN_CLOSE_WRITE:
                    self._seen.append(Write(path, "opened for writing"))
        return list(self._seen)

    def close(self) -> None:
        os.close(self._fd)
