"""The backend as the phase modules (restore, replay, reading, commit, snapshots) see it.

RocksDBBackend (the package's `__init__`) holds the phases' shared state and calls them; they take
it as a PhaseBackend, so none of them imports the package that imports them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol

from ...leases import CommitLease
from ...local_recovery import LocalRecoveryStore
from ...manifest import ChangesRef, FileRef, Manifest
from ...remote import RemoteFile, RemoteStore
from ..context import StoreContext
from .config import RocksDBConfig
from .local_db import LocalDB


class PhaseBackend(Protocol):
    """What the phases use of RocksDBBackend: its store and confs, the local DB (its one piece of
    mutable state), local recovery copies, and the StateBackend methods that read and name manifests."""

    ctx: StoreContext
    remote: RemoteStore
    config: RocksDBConfig
    db: LocalDB
    local_copies: LocalRecoveryStore | None
    # Changelog rows committed since the last local copy (commit.local_copy_due).
    rows_since_local_copy: int

    def fault_point(self, name: str, moved: int = 0) -> None: ...

    def read_manifest(self, version: int, checkpoint_id: str | None = None) -> Manifest: ...

    def read_snapshot(self, version: int, manifest_id: str) -> Manifest | None: ...

    def chain_back(self, m: Manifest, cache: dict[str, Manifest] | None = None) -> Iterator[Manifest]: ...

    def attempt_for_lookup(self, manifest_id: str | None) -> str | None: ...

    def check_base(self, version: int, actual: str, expected: str | None) -> None: ...

    def commit_attempt(self, version: int) -> CommitLease: ...

    def dependencies(
        self,
        m: Manifest,
        *,
        snapshots: Mapping[tuple[int, str], RemoteFile],
        now: float,
        cache: dict[str, Manifest] | None = None,
    ) -> set[str]: ...

    def new_manifest(
        self,
        version: int,
        num_keys: int,
        attempt_id: str,
        *,
        shared: dict[str, FileRef] | None = None,
        private: dict[str, FileRef] | None = None,
    ) -> Manifest: ...

    def new_changelog_manifest(
        self, version: int, num_keys: int, attempt_id: str, *, parent_manifest_id: str, changes: ChangesRef
    ) -> Manifest: ...
