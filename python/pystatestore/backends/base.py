"""The backend interface the service drives. A backend owns one store's versions and their files."""

from __future__ import annotations

import abc
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from ..errors import CheckpointDamagedError, CheckpointMissingError
from ..manifest import MANIFEST_DIR, FileRef, Manifest, manifest_path, version_of_manifest
from ..remote import RemoteStore
from ..retention import RetentionPlan, plan_retention

# Called at named points of commits and garbage collection; the model-based tests raise from it
# to simulate a worker dying between any two steps.
FaultHook = Callable[[str], None]


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
    local_dir: str = ""  # scratch space on this host for the backend's working files

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
    bytes_read: int  # from checkpoint storage; 0 when served from memory or a local copy
    source: str  # "memory", "remote", "local-copy" or "local-copy+remote"
    metrics: dict[str, int] = field(default_factory=dict)  # backend-specific, reported to Spark


@dataclass(frozen=True)
class CommitResult:
    version: int
    num_keys: int
    bytes_written: int
    files_written: int
    manifest: str
    metrics: dict[str, int] = field(default_factory=dict)  # backend-specific, reported to Spark


class StateBackend(abc.ABC):
    """One store's versions. Implementations must be safe to call from one thread at a time
    (the service serialises calls per store)."""

    name: str

    def __init__(self, ctx: StoreContext, remote: RemoteStore) -> None:
        self.ctx = ctx
        self.remote = remote
        self.fault_hook: FaultHook | None = None

    def _fault_point(self, name: str) -> None:
        if self.fault_hook is not None:
            self.fault_hook(name)

    @abc.abstractmethod
    def load(self, version: int) -> LoadResult: ...

    @abc.abstractmethod
    def commit(self, base_version: int, changes: pa.Table, attempt_id: str) -> CommitResult: ...

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op for stateless backends
        """Drops in-memory state; files stay."""

    # -- manifests -------------------------------------------------------------------------
    def read_manifest(self, version: int) -> Manifest:
        rel = manifest_path(version)
        if not self.remote.exists(rel):
            raise CheckpointMissingError(
                "this version was never committed or has been removed by retention",
                store=self.ctx.store_dir,
                version=version,
                file=rel,
                advice="Spark asked for a version the checkpoint does not hold; check "
                "spark.sql.streaming.minBatchesToRetain and that the checkpoint was not edited.",
            )
        data = self.remote.read_bytes(rel, version=version)
        return Manifest.from_json(data.to_pybytes(), store=self.ctx.store_dir, version=version, file=rel)

    def new_manifest(
        self,
        version: int,
        num_keys: int,
        attempt_id: str,
        *,
        shared: dict[str, FileRef] | None = None,
        private: dict[str, FileRef] | None = None,
    ) -> Manifest:
        """The manifest of `version` (based on `version - 1`) for this store and backend."""
        return Manifest(
            store=self.ctx.identity,
            version=version,
            base_version=version - 1,
            backend=self.name,
            key_schema=self.ctx.key_schema,
            value_schema=self.ctx.value_schema,
            num_keys=num_keys,
            attempt_id=attempt_id,
            shared=shared or {},
            private=private or {},
        )

    # -- retention (DESIGN §4) -------------------------------------------------------------
    def maintenance(self, now: float | None = None) -> dict[str, Any]:
        """Deletes what no retained version needs. Manifests go first, so a crash part-way leaves
        only unreferenced files, which the next run (recomputing the same plan) removes."""
        now = time.time() if now is None else now
        manifests = self.remote.list_files(MANIFEST_DIR)
        data_files = [f for d in ("private", "shared", "changelog") for f in self.remote.list_files(d)]
        refs: dict[int, list[str] | None] = {}
        for f in manifests:
            v = version_of_manifest(f.path)
            if v is None:
                continue
            try:
                refs[v] = [r.path for r in self.read_manifest(v).files()]
            except (CheckpointDamagedError, CheckpointMissingError):
                refs[v] = None  # unknown needs: keep every data file
        plan = plan_retention(
            manifests + data_files,
            refs,
            min_versions_to_retain=self.ctx.min_versions_to_retain,
            now=now,
            orphan_grace_seconds=self.ctx.orphan_grace_seconds,
        )
        for rel in plan.delete_manifests + plan.delete_files:
            self.remote.delete(rel)
            self._fault_point("gc:deleted")
        if plan.delete_files:
            self.remote.delete_empty_dirs("private")
        self._after_retention(plan)
        return {
            "lowestRetained": plan.lowest_retained,
            "deletedManifests": len(plan.delete_manifests),
            "deletedFiles": len(plan.delete_files),
            "keptVersions": len(plan.kept_versions),
        }

    def _after_retention(self, plan: RetentionPlan) -> None:  # noqa: B027 - optional hook
        """Lets a backend drop cached versions that retention removed."""
