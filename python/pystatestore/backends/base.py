"""The backend interface the service drives. A backend owns one store's versions and their files."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from ..remote import RemoteStore


@dataclass(frozen=True)
class StoreContext:
    """What a backend knows of its store (from the JVM's `openStore` description)."""

    store_dir: str
    operator_id: int
    partition_id: int
    store_name: str
    key_schema: str
    value_schema: str
    min_versions_to_retain: int
    orphan_grace_seconds: float
    options: dict[str, str] = field(default_factory=dict)

    @property
    def identity(self) -> dict[str, Any]:
        return {
            "dir": self.store_dir,
            "operatorId": self.operator_id,
            "partitionId": self.partition_id,
            "storeName": self.store_name,
        }


@dataclass(frozen=True)
class LoadResult:
    frame: pa.Buffer  # Arrow IPC stream (key, value) of the whole version
    num_keys: int
    bytes_read: int  # from checkpoint storage; 0 when served from memory
    source: str  # "memory" or "remote"


@dataclass(frozen=True)
class CommitResult:
    version: int
    num_keys: int
    bytes_written: int
    files_written: int
    manifest: str


class StateBackend(abc.ABC):
    """One store's versions. Implementations must be safe to call from one thread at a time
    (the service serialises calls per store)."""

    name: str

    def __init__(self, ctx: StoreContext, remote: RemoteStore) -> None:
        self.ctx = ctx
        self.remote = remote

    @abc.abstractmethod
    def load(self, version: int) -> LoadResult: ...

    @abc.abstractmethod
    def commit(self, base_version: int, changes: pa.Table, attempt_id: str) -> CommitResult: ...

    @abc.abstractmethod
    def maintenance(self, now: float) -> dict[str, Any]: ...

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op for stateless backends
        """Drops in-memory state; files stay."""
