"""The backend interface the service drives. A backend owns one store's versions and their files."""

from __future__ import annotations

import abc
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from .. import frames
from ..errors import BaseVersionReplacedError, CheckpointDamagedError, CheckpointMissingError, StoreConfigError
from ..leases import LEASE_DIR, Clock, CommitLease, validate_grace
from ..manifest import KEY_ENCODING_RAW, MANIFEST_DIR, FileRef, Manifest, manifest_path, version_of_manifest
from ..remote import RemoteStore, describe_foreign_layout
from ..retention import RetentionPlan, plan_retention, version_of_replaced_manifest

log = logging.getLogger("pystatestore.backends")
BACKEND_CONF = "spark.sql.streaming.stateStore.pystatestore.backend"

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
    # How the JVM encodes keys in change frames (manifest.KEY_ENCODING_*); recorded in manifests.
    key_encoding: str = KEY_ENCODING_RAW
    # Where the JVM asks for read views (rocksdb): every view directory must be a child of it.
    views_dir: str = ""
    # This host's base directory for pystatestore (spark.local.dir or java.io.tmpdir): the default
    # local recovery directory goes there, on the same filesystem as the local databases.
    host_dir: str = ""

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
    frame: pa.Buffer | None  # Arrow IPC stream (key, value) of the whole version; None for view backends
    num_keys: int
    bytes_read: int  # from checkpoint storage; 0 when served from memory or a local copy
    source: str  # "memory", "remote", "local-copy" or "local-copy+remote"
    metrics: dict[str, int] = field(default_factory=dict)  # backend-specific, reported to Spark
    manifest_id: str = ""  # which attempt's manifest this is ("" for version 0)


@dataclass(frozen=True)
class CommitResult:
    version: int
    num_keys: int
    bytes_written: int
    files_written: int
    manifest: str
    metrics: dict[str, int] = field(default_factory=dict)  # backend-specific, reported to Spark
    manifest_id: str = ""


class StateBackend(abc.ABC):
    """One store's versions. Implementations must be safe to call from one thread at a time
    (the service serialises calls per store)."""

    name: str
    # How the JVM reads committed versions: "frame" (load ships every pair; the JVM keeps them on
    # its heap) or "view" (load and commit leave a RocksDB checkpoint the JVM opens read-only).
    read_path: str = "frame"
    key_encodings: tuple[str, ...] = (KEY_ENCODING_RAW,)

    def __init__(self, ctx: StoreContext, remote: RemoteStore) -> None:
        validate_grace(ctx.orphan_grace_seconds, store=ctx.store_dir)
        if ctx.key_encoding not in self.key_encodings:
            raise StoreConfigError(
                f"the {self.name} backend cannot store keys encoded as {ctx.key_encoding!r}",
                store=ctx.store_dir,
                advice="The JVM shim and the Python package are of different pystatestore releases; install the "
                "same release for both.",
            )
        self.ctx = ctx
        self.remote = remote
        self.fault_hook: FaultHook | None = None
        # Wall clock for leases and GC; the model-based test moves it forward to simulate time passing.
        self.clock: Clock = time.time

    def _fault_point(self, name: str) -> None:
        if self.fault_hook is not None:
            self.fault_hook(name)

    def commit_attempt(self, version: int) -> CommitLease:
        """The lease of a new commit attempt at `version`; its token goes into every file name it writes."""
        return CommitLease(
            self.remote, uuid.uuid4().hex, version, grace_seconds=self.ctx.orphan_grace_seconds, clock=self.clock
        )

    @abc.abstractmethod
    def load(self, version: int, view_dir: str | None = None) -> LoadResult:
        """Makes `version` readable: as a frame of all pairs, or (view backends) as a read view
        written to `view_dir`, which must not exist yet."""

    @abc.abstractmethod
    def commit(
        self,
        base_version: int,
        changes: frames.Changes,
        attempt_id: str,
        base_manifest_id: str | None = None,
        *,
        num_keys: int | None = None,
        view_dir: str | None = None,
    ) -> CommitResult:
        """Makes `base_version + 1` durable. `base_manifest_id`, when given, is the attempt at the
        base version the caller computed the changes on; a commit on a base another attempt has
        since replaced raises BaseVersionReplacedError. `num_keys` is the new version's key count
        as the caller (the JVM, which saw whether each key existed) computed it; view backends
        need it and also leave the new version's read view at `view_dir`."""

    def check_base(self, version: int, actual: str, expected: str | None) -> None:
        if expected is not None and expected != actual:
            raise BaseVersionReplacedError(
                f"this commit was computed on attempt {expected or '(empty)'} of version {version}, but the "
                f"checkpoint now holds attempt {actual or '(empty)'}",
                store=self.ctx.store_dir,
                version=version,
                file=manifest_path(version),
            )

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op for stateless backends
        """Drops in-memory state; files stay."""

    # -- manifests -------------------------------------------------------------------------
    def read_manifest(self, version: int) -> Manifest:
        """The manifest of `version`, checked to belong to this store and this backend."""
        m = self.read_any_manifest(version)
        self._check_identity(m, manifest_path(version))
        return m

    def read_any_manifest(self, version: int) -> Manifest:
        """The manifest of `version` as stored, whichever backend wrote it (validated, not yet matched)."""
        rel = manifest_path(version)
        if not self.remote.exists(rel):
            aside = self._newest_replaced(version)
            if aside is not None:
                return aside
            foreign = describe_foreign_layout(self.remote)
            if foreign is not None:
                raise CheckpointMissingError(
                    f"this store directory holds state written by {foreign}, not by pystatestore",
                    store=self.ctx.store_dir,
                    version=version,
                    file=rel,
                    advice="pystatestore cannot read another provider's files. Keep the provider the checkpoint "
                    "was created with (spark.sql.streaming.stateStore.providerClass), or start the query "
                    "from a new checkpoint location.",
                )
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

    def _newest_replaced(self, version: int) -> Manifest | None:
        """A manifest `RemoteStore.publish` set aside and whose replacement never landed (a crash
        between its two renames): still a committed state of the version."""
        found = []
        for rel in self.remote.replaced_versions_of(manifest_path(version)):
            data = self.remote.read_bytes(rel, version=version)
            found.append(Manifest.from_json(data.to_pybytes(), store=self.ctx.store_dir, version=version, file=rel))
        return max(found, key=lambda m: m.created_at) if found else None

    def _check_identity(self, m: Manifest, rel: str) -> None:
        """Refuses a manifest of another backend or another store: reading it would mean carrying on
        with the wrong (usually empty) state."""
        if m.backend != self.name:
            raise StoreConfigError(
                f"version {m.version} of this store was written by the '{m.backend}' backend, but this query "
                f"runs the '{self.name}' backend, which cannot read its files",
                store=self.ctx.store_dir,
                version=m.version,
                file=rel,
                advice=f"Set {BACKEND_CONF}={m.backend} to keep using this checkpoint, or start the query from "
                f"a new checkpoint location to switch to '{self.name}'. Nothing was read or changed.",
            )
        mine = self.ctx.identity
        theirs = {k: m.store.get(k) for k in ("operatorId", "partitionId", "storeName")}
        if theirs != {k: mine[k] for k in theirs}:
            raise CheckpointDamagedError(
                f"the manifest describes operator {theirs['operatorId']}, partition {theirs['partitionId']}, "
                f"store '{theirs['storeName']}', not this store (operator {mine['operatorId']}, partition "
                f"{mine['partitionId']}, store '{mine['storeName']}')",
                store=self.ctx.store_dir,
                version=m.version,
                file=rel,
                advice="Files were copied between store directories or tampered with; nothing was read or "
                "deleted. Restore the store directory from a backup or start from a new checkpoint location.",
            )
        if m.key_encoding != self.ctx.key_encoding:
            raise StoreConfigError(
                f"version {m.version} stores its keys encoded as {m.key_encoding!r} (manifest format {m.format}), "
                f"but this store reads them as {self.ctx.key_encoding!r}",
                store=self.ctx.store_dir,
                version=m.version,
                file=rel,
                advice="The checkpoint was written by a pystatestore release with another key layout for this kind "
                "of store (prefix-scan stores, e.g. session windows, changed in 0.3.0). Run the query with the "
                "release that wrote it, or start it from a new checkpoint location. Nothing was read or changed.",
            )
        if m.store.get("dir") != self.ctx.store_dir:
            log.debug("store %s: version %d was written at %s (checkpoint moved)", mine, m.version, m.store.get("dir"))

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
            key_encoding=self.ctx.key_encoding,
        )

    # -- retention (DESIGN §4) -------------------------------------------------------------
    def maintenance(self, now: float | None = None) -> dict[str, Any]:
        """Deletes what no retained version needs. Manifests go first, so a crash part-way leaves
        only unreferenced files, which the next run (recomputing the same plan) removes. `now` is
        taken before anything is listed, so a lease renewed during the listing is seen as live."""
        now = self.clock() if now is None else now
        manifests = self.remote.list_files(MANIFEST_DIR)
        leases = self.remote.list_files(LEASE_DIR)
        data_files = [f for d in ("private", "shared", "changelog") for f in self.remote.list_files(d)]
        attempt_dirs = self.remote.list_dirs("private")
        versions = {version_of_manifest(f.path) for f in manifests} | {
            version_of_replaced_manifest(f.path) for f in manifests
        }
        refs: dict[int, list[str] | None] = {}
        for v in sorted(versions - {None}):
            try:
                refs[v] = [r.path for r in self.read_any_manifest(v).files()]
            except (CheckpointDamagedError, CheckpointMissingError):
                refs[v] = None  # unknown needs: keep every data file
        plan = plan_retention(
            manifests + leases + data_files,
            refs,
            min_versions_to_retain=self.ctx.min_versions_to_retain,
            now=now,
            orphan_grace_seconds=self.ctx.orphan_grace_seconds,
            dirs=attempt_dirs,
        )
        for rel in plan.delete_manifests + plan.delete_files:
            self.remote.delete(rel)
            self._fault_point("gc:deleted")
        removed_dirs = sum(self.remote.remove_dir_if_empty(d) for d in plan.delete_dirs)
        self._after_retention(plan)
        return {
            "lowestRetained": plan.lowest_retained,
            "deletedManifests": len(plan.delete_manifests),
            "deletedFiles": len(plan.delete_files),
            "deletedDirs": removed_dirs,
            "keptVersions": len(plan.kept_versions),
        }

    def _after_retention(self, plan: RetentionPlan) -> None:  # noqa: B027 - optional hook
        """Lets a backend drop cached versions that retention removed."""
