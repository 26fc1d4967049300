"""State backends: how a store's versions are kept and made durable."""

from __future__ import annotations

from .base import CommitResult, LoadResult, StateBackend, StoreContext
from .memory import MemoryBackend

BACKENDS: dict[str, type[StateBackend]] = {MemoryBackend.name: MemoryBackend}
DEFAULT_BACKEND = MemoryBackend.name

__all__ = ["BACKENDS", "DEFAULT_BACKEND", "CommitResult", "LoadResult", "MemoryBackend", "StateBackend", "StoreContext"]
