"""State backends: how a store's versions are kept and made durable."""

from __future__ import annotations

from .base import StateBackend
from .context import CommitResult, LoadResult, StoreContext
from .memory import MemoryBackend
from .rocksdb import RocksDBBackend

BACKENDS: dict[str, type[StateBackend]] = {MemoryBackend.name: MemoryBackend, RocksDBBackend.name: RocksDBBackend}
DEFAULT_BACKEND = RocksDBBackend.name

__all__ = [
    "BACKENDS",
    "DEFAULT_BACKEND",
    "CommitResult",
    "LoadResult",
    "MemoryBackend",
    "RocksDBBackend",
    "StateBackend",
    "StoreContext",
]
