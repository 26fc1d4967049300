"""The `rocksdb` backend: Flink's incremental RocksDB checkpoints (DESIGN §3, §4), via rocksdict.

Every commit writes the version's changes into the local RocksDB (as one ingested SST file) and
takes a native checkpoint (hard links), which the JVM reads as the version's view. What it makes
durable depends on the commit mode:
- `changelog` (Flink's FLIP-158, Spark's changelog checkpointing): the version's changes, as a
  compressed segment inside the manifest when small (else under `changelog/`), and a manifest that
  names the attempt they apply to. Maintenance later materializes a snapshot of a version once the
  chain since the last one is long or large, off the commit path.
- `snapshot`: the SST files the version's nearest snapshot does not already hold, and a manifest
  listing every file. Small files (RocksDB's MANIFEST, CURRENT, ...) are stored inside it, and a file
  the snapshot holds with the same content (OPTIONS) is reused, so a small store's version is one
  manifest plus its new SSTs.
The manifest is written last, atomically: it is the commit point.

Python writes, the JVM reads (DESIGN §2): a commit's or load's checkpoint directory is left where
the JVM asked (`view_dir`); the JVM owns view directories and deletes them once closed, so nothing
here ever prunes a directory the JVM has open. The key count comes from the JVM, which saw whether
each changed key existed: the worker never reads keys.

The backend is split by phase, each a module of functions over the backend and its one piece of
mutable state, the local DB (local_db.py): config.py (confs and RocksDB options), restore.py and
replay.py (bringing the local DB to a version; restore_stats.py counts what that read), reading.py
(views, replay from a snapshot, the change feed), commit.py, snapshots.py (snapshot manifests,
materialization by maintenance). The phases take the backend as a PhaseBackend (phase_backend.py),
what they use of it, so they never import this package.
"""

from __future__ import annotations

import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from ... import frames
from ...local_recovery import DEFAULT_VERSIONS_KEPT, LocalRecoveryStore, clean_stale_stores, default_root
from ...manifest import KEY_ENCODING_FAMILIES, KEY_ENCODING_PREFIX, KEY_ENCODING_RAW, MANIFEST_DIR, manifest_path
from ...remote import RemoteStore
from ..base import StateBackend
from ..context import CommitResult, LoadResult
from . import commit as commit_phase
from . import reading, snapshots
from .config import RocksDBConfig, int_option
from .local_db import LocalDB
from .snapshots import Materialization

STALE_COPY_SCAN_INTERVAL_S = 3600.0
_last_stale_scan_lock = threading.Lock()
_last_stale_scan: dict[Path, float] = {}

__all__ = ["Materialization", "RocksDBBackend"]


class RocksDBBackend(StateBackend):
    name = "rocksdb"
    read_path = "view"
    key_encodings = (KEY_ENCODING_RAW, KEY_ENCODING_PREFIX, KEY_ENCODING_FAMILIES)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        store, opts = self.ctx.store_dir, self.ctx.options
        self.config = RocksDBConfig.of(opts, store=store)
        self.keeps_snapshotted_changes = self.config.keep_snapshotted_changes
        base = Path(self.ctx.local_dir or tempfile.gettempdir()) / "rocksdb"
        base.mkdir(parents=True, exist_ok=True)
        work_dir = Path(tempfile.mkdtemp(prefix=f"op{self.ctx.operator_id}-p{self.ctx.partition_id}-", dir=base))
        self.db = LocalDB(work_dir, store, self.config.l0_trigger)
        self.local_copies: LocalRecoveryStore | None = None
        # Changelog rows committed since this instance last kept a local copy: what a restore from
        # that copy would replay (commit.local_copy_due).
        self.rows_since_local_copy = 0
        if opts.get("localRecovery", "true").lower() == "true":
            self.local_copies = LocalRecoveryStore(
                Path(opts.get("localRecoveryDir") or default_root(self.ctx.host_dir)),
                store,
                int_option(opts, "localRecoveryVersions", DEFAULT_VERSIONS_KEPT, minimum=1, store=store),
                hook=self.fault_point,
            )

    @property
    def work_dir(self) -> Path:
        """Where the store's local DB, change files and checkpoints in the making live."""
        return self.db.work_dir

    # -- reading -------------------------------------------------------------------------
    def load(self, version: int, view_dir: str | None = None, checkpoint_id: str | None = None) -> LoadResult:
        """Makes the local DB hold `version` and leaves it as a read view at `view_dir` (a RocksDB
        checkpoint: hard links). Nothing proportional to the number of keys is read or sent.
        Without `view_dir` (Python callers) only the local DB is brought to `version`."""
        return reading.load(self, version, view_dir, checkpoint_id)

    def replay(
        self,
        snapshot_version: int,
        end_version: int,
        view_dir: str | None = None,
        *,
        snapshot_id: str | None = None,
        end_id: str | None = None,
    ) -> LoadResult:
        """Spark's replayStateFromSnapshot: the state of `end_version` built from the snapshot of
        `snapshot_version` (which must exist) and the changes after it, bypassing every shortcut
        (local DB, local copies of later versions), e.g. to get around a damaged later snapshot."""
        return reading.replay_from_snapshot(
            self, snapshot_version, end_version, view_dir, snapshot_id=snapshot_id, end_id=end_id
        )

    def view_after_commit(self, version: int, manifest_id: str, view_dir: str) -> LoadResult:
        """The read view of a durable-first commit whose apply did not leave it (see reading)."""
        return reading.view_after_commit(self, version, manifest_id, view_dir)

    def snapshot_versions(self) -> list[int]:
        """Versions that have a snapshot (their own manifest, or one maintenance made)."""
        return reading.snapshot_versions(self)

    def changes(
        self, start_version: int, end_version: int, end_id: str | None = None
    ) -> Iterator[tuple[int, pa.RecordBatch]]:
        """The change feed: each version's changes (op, key, value), start to end inclusive."""
        return reading.changes(self, start_version, end_version, end_id)

    # -- writing -------------------------------------------------------------------------
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
        """See StateBackend.commit. With `durable_first` a small changelog commit that leaves a view
        returns once the version is durable, with the rest (the local DB, the view) as the result's
        `finish`: the caller runs it under the store's lock before anything else touches the store."""
        version = base_version + 1
        if num_keys is None or num_keys < 0:
            raise commit_phase.missing_key_count(self, version)
        checkpoint_dir = (
            reading.view_target(self, view_dir, version)
            if view_dir is not None
            else self.work_dir / f"ckpt-{version}-{uuid.uuid4().hex[:8]}"
        )
        with self.commit_attempt(version) as lease:
            if base_version > 0 and not empty_base and self._rerun(version, base_manifest_id):
                # Spark re-runs an older batch (or retries one that was durable): the base may already
                # be below the retained versions, so keep GC off it while this attempt runs.
                lease.pin_base(base_version)
            deferrable = self.config.mode == "changelog" and view_dir is not None and not empty_base
            if durable_first and self.config.durable_first and deferrable:
                # Tables (Python callers) are sorted here; a stream (the JVM's) comes sorted and is checked.
                whole, changes = commit_phase.small_whole_state(
                    frames.sorted_by_key(changes), commit_phase.DURABLE_FIRST_MAX_FRAME_BYTES
                )
                if whole is not None:
                    result = commit_phase.commit_durable_first(
                        self,
                        lease,
                        base_version,
                        whole,
                        attempt_id,
                        base_manifest_id,
                        num_keys,
                        checkpoint_dir,
                        num_internal_keys,
                    )
                    return replace(result, snapshot_due=snapshots.snapshot_due_at(self, version))
            result = commit_phase.commit_under(
                self,
                lease,
                base_version,
                changes,
                attempt_id,
                base_manifest_id,
                num_keys,
                checkpoint_dir,
                view_dir,
                empty_base=empty_base,
                num_internal_keys=num_internal_keys,
            )
        return replace(result, snapshot_due=self.snapshot_due())

    def _rerun(self, version: int, base_manifest_id: str | None) -> bool:
        """Whether `version` may already be committed (so its base may be old). Under checkpoint ids,
        where a version's attempts cannot be found without a listing, any commit on a base the local
        DB does not hold counts: a restart, a retry, or a re-run."""
        if not self.ctx.checkpoint_ids:
            return self.remote.exists(manifest_path(version))
        return not (self.db.version == version - 1 and self.db.manifest_id == base_manifest_id)

    # -- snapshots and maintenance ------------------------------------------------------------
    def prepare_materialization(self, force: bool = False) -> Materialization | None:
        return snapshots.prepare_materialization(self, force)

    def finish_materialization(self, job: Materialization) -> None:
        snapshots.finish_materialization(self, job)

    def complete_materialization(self, job: Materialization) -> None:
        snapshots.complete_materialization(self, job)

    def snapshot_due(self) -> bool:
        return snapshots.snapshot_due(self)

    def maintenance(self, now: float | None = None) -> dict[str, Any]:
        report = super().maintenance(now)
        if self.local_copies is not None:
            report["staleLocalStoresRemoved"] = _scan_stale_copies(self.local_copies.dir.parent.parent)
        return report

    def close(self) -> None:
        self.db.close()


def _scan_stale_copies(root: Path) -> int:
    """At most hourly per worker: drop local copies of stores whose checkpoint no longer exists."""
    with _last_stale_scan_lock:
        if time.time() - _last_stale_scan.get(root, 0.0) < STALE_COPY_SCAN_INTERVAL_S:
            return 0
        _last_stale_scan[root] = time.time()

    def store_exists(store_dir: str) -> bool:
        try:
            return RemoteStore(store_dir).exists(MANIFEST_DIR)
        except Exception:  # noqa: BLE001 - unknown or unreachable storage: keep the copies
            return True

    return clean_stale_stores(root, store_exists)
