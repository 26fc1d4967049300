"""This worker's resident memory: reported to Spark with every load and commit, and handed back to
the OS after each commit."""

from __future__ import annotations

import ctypes
import os
from typing import Any

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
