"""The backend interface the service drives. A backend owns one store's versions and their files.

StateBackend is the contract (load, commit, maintenance) and what every backend shares: reading
and checking manifests, walking a changelog chain, naming new manifests. What maintenance deletes
is worked out, and deleted, in cleanup.py."""

from __future__ import annotations

import abc
import logging
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pyarrow as pa

from .. import frames
from ..errors import BaseVersionReplacedError, CheckpointDamagedError, CheckpointMissingError, StoreConfigError
from ..leases import Clock, CommitLease, validate_grace
from ..manifest import (
    KEY_ENCODING_RAW,
    KIND_CHANGELOG,
    MANIFEST_DIR,
    ChangesRef,
    FileRef,
    Manifest,
    checkpoint_id_of_manifest,
    is_checkpoint_id,
    manifest_path,
    snapshot_path,
    version_of_manifest,
)
from ..remote import RemoteFile, RemoteStore, describe_foreign_layout
from ..retention import RetentionPlan
from . import cleanup
from .context import (
    BACKEND_CONF,
    CommitResult,
    FaultHook,
    LoadResult,
    ParsedManifests,
    StoreContext,
)

log = logging.getLogger("pystatestore.backends")


class StateBackend(abc.ABC):
    """One store's versions. Implementations must be safe to call from one thread at a time
    (the service serialises calls per store)."""

    name: str
    # How the JVM reads committed versions: "frame" (load ships every pair; the JVM keeps them on
    # its heap) or "view" (load and commit leave a RocksDB checkpoint the JVM opens read-only).
    read_path: str = "frame"
    key_encodings: tuple[str, ...] = (KEY_ENCODING_RAW,)
    # Whether a changelog version's changes file stays once a snapshot of it exists (decision 0043).
    keeps_snapshotted_changes: bool = True

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
        # Sees every transfer point with the bytes it moved (the offline reader's progress bars).
        self.transfer_observer: Callable[[str, int], None] | None = None
        # Wall clock for leases and GC; the model-based test moves it forward to simulate time passing.
        self.clock: Clock = time.time
        self.parsed = ParsedManifests()

    def fault_point(self, name: str, moved: int = 0) -> None:
        if self.transfer_observer is not None:
            self.transfer_observer(name, moved)
        if self.fault_hook is not None:
            self.fault_hook(name)

    def commit_attempt(self, version: int) -> CommitLease:
        """The lease of a new commit attempt at `version`; its token goes into every file name it writes."""
        return CommitLease(
            self.remote, uuid.uuid4().hex, version, grace_seconds=self.ctx.orphan_grace_seconds, clock=self.clock
        )

    @abc.abstractmethod
    def load(self, version: int, view_dir: str | None = None, checkpoint_id: str | None = None) -> LoadResult:
        """Makes `version` readable: as a frame of all pairs, or (view backends) as a read view
        written to `view_dir`, which must not exist yet. `checkpoint_id` names the attempt
        (Spark's checkpoint format v2)."""

    @abc.abstractmethod
    def commit(
        self,
        base_version: int,
        changes: frames.Changes,
        attempt_id: str,
        base_manifest_id: str | None = None,
        *,
        num_keys: int | None = None,
        num_internal_keys: int = 0,
        view_dir: str | None = None,
        empty_base: bool = False,
        durable_first: bool = False,
    ) -> CommitResult:
        """Makes `base_version + 1` durable. `base_manifest_id`, when given, is the attempt at the
        base version the caller computed the changes on; a commit on a base another attempt has
        since replaced raises BaseVersionReplacedError. `num_keys` is the new version's key count
        as the caller (the JVM, which saw whether each key existed) computed it; view backends
        need it and also leave the new version's read view at `view_dir`. `num_internal_keys` (of
        `num_keys`, those of internal column families) is recorded for the JVM's metrics. With `empty_base` the
        changes apply to an empty state, whatever the store holds at `base_version`, and the new
        version is a snapshot that needs no earlier version (Spark's `loadEmpty`: a state rewrite
        writes a store's whole state as one version). With `durable_first` a backend may return as
        soon as the version is durable, leaving the rest (e.g. the view) to the result's `finish`,
        which the caller runs under the store's lock before the store's next call."""

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

    # -- optional capabilities (the rocksdb backend has them) ------------------------------
    def prepare_materialization(self, force: bool = False) -> Any | None:
        """Under the store's lock: a snapshot job if one is due, or any is missing and `force`d (see
        the rocksdb backend), else None. Backends whose every commit is a snapshot return None."""
        return None

    def snapshot_due(self) -> bool:
        """Whether the newest version this instance holds is due a snapshot, by what it knows
        locally (no reads). Backends whose every commit is a snapshot: never."""
        return False

    def finish_materialization(self, job: Any) -> None:  # noqa: B027 - only called with a job
        """Without the store's lock: makes the snapshot `prepare_materialization` set up durable."""

    def complete_materialization(self, job: Any) -> None:  # noqa: B027 - only called with a job
        """Under the store's lock again: lets the backend know the snapshot exists."""

    def changes(
        self, start_version: int, end_version: int, end_id: str | None = None
    ) -> Iterator[tuple[int, pa.RecordBatch]]:
        """The change feed, version by version; only changelog backends record changes."""
        raise self._unsupported("records no per-version changes (the change feed)")

    def replay(
        self,
        snapshot_version: int,
        end_version: int,
        view_dir: str | None = None,
        *,
        snapshot_id: str | None = None,
        end_id: str | None = None,
    ) -> LoadResult:
        """A version rebuilt from an older snapshot; only changelog backends can."""
        raise self._unsupported("keeps no snapshots to replay from (snapshotStartBatchId)")

    def _unsupported(self, what: str) -> StoreConfigError:
        return StoreConfigError(
            f"the {self.name} backend {what}",
            store=self.ctx.store_dir,
            advice=f"Write the checkpoint with {BACKEND_CONF}=rocksdb (the default) to read it this way.",
        )

    # -- manifests -------------------------------------------------------------------------
    def read_manifest(self, version: int, checkpoint_id: str | None = None) -> Manifest:
        """The manifest of `version` (of its attempt `checkpoint_id`, when given: Spark's checkpoint
        format v2), checked to belong to this store and this backend."""
        m = self.read_any_manifest(version, checkpoint_id)
        self.check_identity(m, m.path)
        return m

    def read_any_manifest(self, version: int, checkpoint_id: str | None = None) -> Manifest:
        """The manifest of `version` as stored, whichever backend wrote it (validated, not yet matched).
        Without `checkpoint_id`, a store written with checkpoint ids is read only if the version has
        a single attempt: which of several counts is in Spark's commit log, not in the store."""
        if checkpoint_id is not None:
            return self._read_attempt(version, checkpoint_id)
        rel = manifest_path(version)
        if not self.remote.exists(rel):
            aside = self._newest_replaced(version)
            if aside is not None:
                return aside
            attempts = self.attempts_of(version)
            if len(attempts) == 1:
                return self._read_attempt(version, attempts[0])
            if attempts:
                raise StoreConfigError(
                    f"version {version} was committed by {len(attempts)} attempts under checkpoint format v2 "
                    f"({', '.join(attempts[:4])}{', ...' if len(attempts) > 4 else ''}) and no checkpoint id says "
                    "which one to read",
                    store=self.ctx.store_dir,
                    version=version,
                    file=rel,
                    advice="Spark's commit log names the attempt of each batch: read the state through Spark (the "
                    "state data source reads the commit log) or with the pystatestore tools given the query's "
                    "checkpoint location. Nothing was read or changed.",
                )
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
        return self._parsed_file(rel, version)

    def _parsed_file(self, rel: str, version: int) -> Manifest:
        """The manifest (or snapshot manifest) stored at `rel`, read and validated."""
        data = self.remote.read_bytes(rel, version=version)
        return Manifest.from_json(data.to_pybytes(), store=self.ctx.store_dir, version=version, file=rel)

    def attempts_of(self, version: int) -> list[str]:
        """The checkpoint ids of `version`'s attempts published under checkpoint format v2."""
        return sorted(
            cid
            for f in self.remote.list_files(MANIFEST_DIR)
            if version_of_manifest(f.path) == version and (cid := checkpoint_id_of_manifest(f.path)) is not None
        )

    def _read_attempt(self, version: int, checkpoint_id: str) -> Manifest:
        """The manifest of attempt `checkpoint_id` of `version` (checkpoint format v2)."""
        if not is_checkpoint_id(checkpoint_id):
            raise StoreConfigError(
                f"checkpoint id {checkpoint_id[:80]!r} of version {version} is not one pystatestore writes "
                "(32 hexadecimal digits)",
                store=self.ctx.store_dir,
                version=version,
                advice="Spark took the id from the query's commit log: the commit log was written with another state "
                "store provider, or edited. Keep the provider the checkpoint was created with, or start the query "
                "from a new checkpoint location. Nothing was read or changed.",
            )
        rel = manifest_path(version, checkpoint_id)
        if not self.remote.exists(rel):
            raise CheckpointMissingError(
                f"attempt {checkpoint_id} of this version was never committed or has been removed by retention",
                store=self.ctx.store_dir,
                version=version,
                file=rel,
                advice="Spark asked for the attempt its commit log names, and the checkpoint does not hold it; check "
                "spark.sql.streaming.minBatchesToRetain and that the checkpoint was not edited or copied without "
                "its state directory.",
            )
        m = self._parsed_file(rel, version)
        if m.checkpoint_id != checkpoint_id:
            raise CheckpointDamagedError(
                f"the manifest describes attempt {m.manifest_id}, not the attempt {checkpoint_id} it is named for",
                store=self.ctx.store_dir,
                version=version,
                file=rel,
                advice="Files were copied or renamed inside the store directory; nothing was read or deleted. Restore "
                "the store directory from a backup or start from a new checkpoint location.",
            )
        return m

    def attempt_for_lookup(self, manifest_id: str | None) -> str | None:
        """The checkpoint id to read an attempt by: its manifest id where manifests are named by id."""
        return manifest_id if self.ctx.checkpoint_ids and manifest_id else None

    def _newest_replaced(self, version: int) -> Manifest | None:
        """A manifest `RemoteStore.publish` set aside and whose replacement never landed (a crash
        between its two renames): still a committed state of the version."""
        found = []
        for rel in self.remote.replaced_versions_of(manifest_path(version)):
            found.append(self._parsed_file(rel, version))
        return max(found, key=lambda m: m.created_at) if found else None

    def check_identity(self, m: Manifest, rel: str) -> None:
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

    def read_snapshot(self, version: int, manifest_id: str) -> Manifest | None:
        """The snapshot maintenance made of changelog version `version` (attempt `manifest_id`),
        checked like a manifest, or None when there is none."""
        rel = snapshot_path(version, manifest_id)
        if not self.remote.exists(rel):
            return None
        m = self._parsed_file(rel, version)
        self.check_identity(m, rel)
        if m.is_changelog or m.manifest_id != manifest_id:
            raise CheckpointDamagedError(
                "a snapshot manifest that does not describe the version it is named for",
                store=self.ctx.store_dir,
                version=version,
                file=rel,
            )
        return m

    def chain_back(self, m: Manifest, cache: dict[str, Manifest] | None = None) -> Iterator[Manifest]:
        """`m`, then the manifest of each version it was committed on, back to a snapshot manifest
        or to version 1. Each parent must be the very attempt its child was committed on. `cache`
        holds manifests already read, by path."""
        cache = {} if cache is None else cache
        current = m
        while True:
            yield current
            if not current.is_changelog or current.base_version == 0:
                return
            parent = cache.get(current.parent_path)
            if parent is None:
                parent = cache[current.parent_path] = self.read_manifest(
                    current.base_version, current.parent_manifest_id if current.checkpoint_id else None
                )
            if parent.manifest_id != current.parent_manifest_id:
                raise CheckpointDamagedError(
                    f"version {current.version} holds changes to attempt {current.parent_manifest_id} of version "
                    f"{current.base_version}, but the checkpoint holds attempt {parent.manifest_id}",
                    store=self.ctx.store_dir,
                    version=current.version,
                    file=current.parent_path,
                    advice="A version was replaced after later versions were committed on it (a task attempt that "
                    "outlived its stage?). Restore the store directory from a backup or start from a new "
                    "checkpoint location.",
                )
            current = parent

    def new_manifest(
        self,
        version: int,
        num_keys: int,
        attempt_id: str,
        *,
        shared: dict[str, FileRef] | None = None,
        private: dict[str, FileRef] | None = None,
    ) -> Manifest:
        """The snapshot manifest of `version` (based on `version - 1`) for this store and backend."""
        return self._named(
            Manifest(
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
        )

    def new_changelog_manifest(
        self, version: int, num_keys: int, attempt_id: str, *, parent_manifest_id: str, changes: ChangesRef
    ) -> Manifest:
        """The changelog manifest of `version`: `changes` applied to attempt `parent_manifest_id` of
        `version - 1`. The schemas are left to snapshot manifests, except at the start of a chain."""
        return self._named(
            Manifest(
                store=self.ctx.identity,
                version=version,
                base_version=version - 1,
                backend=self.name,
                key_schema=self.ctx.key_schema if version == 1 else "",
                value_schema=self.ctx.value_schema if version == 1 else "",
                num_keys=num_keys,
                attempt_id=attempt_id,
                key_encoding=self.ctx.key_encoding,
                kind=KIND_CHANGELOG,
                parent_manifest_id=parent_manifest_id,
                changes=changes,
            )
        )

    def _named(self, m: Manifest) -> Manifest:
        """Under checkpoint format v2 a manifest's id is also its checkpoint id, in its file name."""
        if self.ctx.checkpoint_ids:
            m.checkpoint_id = m.manifest_id
        return m

    # -- retention (DESIGN §4): cleanup.py plans it and deletes ------------------------------
    def maintenance(self, now: float | None = None) -> dict[str, Any]:
        """Deletes what no retained version needs (manifests first: see `cleanup.delete`). `now` is
        taken before anything is listed, so a lease renewed during the listing is seen as live."""
        plan = self.plan_maintenance(now)
        removed_dirs = cleanup.delete(self.remote, plan, self.fault_point)
        self._after_retention(plan)
        return {
            "lowestRetained": plan.lowest_retained,
            "deletedManifests": len(plan.delete_manifests),
            "deletedFiles": len(plan.delete_files),
            "deletedDirs": removed_dirs,
            "keptVersions": len(plan.kept_versions),
        }

    def plan_maintenance(self, now: float | None = None) -> RetentionPlan:
        """What `maintenance` deletes when run at `now`, deleting nothing (`pystatestore gc --dry-run`)."""
        return cleanup.plan(self, self.clock() if now is None else now)

    def needs_by_version(
        self,
        manifests: list[RemoteFile],
        data_files: list[RemoteFile],
        *,
        now: float,
        pinned: frozenset[int] = frozenset(),
    ) -> dict[int, list[str] | None]:
        """What each version with a manifest needs (None: unknown); see `cleanup.needs_by_version`."""
        return cleanup.needs_by_version(self, manifests, data_files, now=now, pinned=pinned)

    def dependencies(
        self,
        m: Manifest,
        *,
        snapshots: Mapping[tuple[int, str], RemoteFile],
        now: float,
        cache: dict[str, Manifest] | None = None,
    ) -> set[str]:
        """Every file version `m` needs to be restored; see `cleanup.dependencies`."""
        return cleanup.dependencies(self, m, snapshots=snapshots, now=now, cache=cache)

    def _after_retention(self, plan: RetentionPlan) -> None:  # noqa: B027 - optional hook
        """Lets a backend drop cached versions that retention removed."""
