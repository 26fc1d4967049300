"""The one piece of state the rocksdb backend's phases share: the store's local RocksDB database and
what it is known to hold.

The local DB is trusted for reuse only while it is exactly the state of one manifest (same version
and same manifest id). SST names are local to a DB lineage, so a file name may only be matched
against the snapshot the local DB descends from (`ancestor`), and only while that snapshot is the
one the version's chain resolves to (so garbage collection keeps it).
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import rocksdict

from ... import changelog, frames
from ...errors import CheckpointDamagedError, LocalDiskError, StoreConfigError, is_disk_failure
from ...manifest import Manifest, manifest_path
from .config import db_options


class LocalDB:
    """The local DB of one store (at most one open at a time) in the store's work directory."""

    def __init__(self, work_dir: Path, store_dir: str, l0_trigger: int) -> None:
        self.work_dir, self.store_dir, self.l0_trigger = work_dir, store_dir, l0_trigger
        self.db: rocksdict.Rdict | None = None
        self.dir: Path | None = None
        self.version: int | None = None  # the committed version the DB holds exactly
        self.manifest_id: str | None = None  # None for version 0 (no manifest)
        self.num_keys = self.num_internal_keys = 0
        # The snapshot manifest whose files (by local name) the DB still holds: what a new snapshot
        # of this DB may reuse instead of uploading. None for a DB of unknown descent.
        self.ancestor: Manifest | None = None
        # The newest version of the DB's chain known to have a snapshot (0: the chain starts at
        # version 1), so a commit can tell that one is due without reading the checkpoint.
        self.snapshot_at: int | None = None
        # What restoring from that snapshot reads (its stored bytes; 0 for version 0), and the
        # stored bytes of each later version's changes: what replaying them would read (0041).
        self.snapshot_bytes = 0
        self.changes_bytes: dict[int, int] = {}
        # The (version, manifest id) held when maintenance last found no snapshot due: periodic
        # maintenance skips the same check of the same version (decision 0038).
        self.no_snapshot_due: tuple[int, str | None] | None = None

    def options(self, *, create: bool) -> rocksdict.Options:
        return db_options(self.l0_trigger, create=create)

    def open(self, db_dir: Path, version: int, manifest: Manifest | None) -> None:
        """Opens `db_dir` as the local DB of `version`. Only version 0 may start empty: a DB restored
        for a manifest must exist, and must hold keys when the manifest says it does."""
        self.drop()
        try:
            db = rocksdict.Rdict(str(db_dir), self.options(create=manifest is None))
        except Exception as e:  # noqa: BLE001 - rocksdict raises a bare Exception for RocksDB errors
            if is_disk_failure(str(e)):  # this host's disk, not the checkpoint's files
                raise LocalDiskError(
                    f"the local database {db_dir} could not be opened ({e})", store=self.store_dir, version=version
                ) from e
            raise CheckpointDamagedError(
                f"the restored files do not open as a RocksDB database ({e})",
                store=self.store_dir,
                version=version,
                file=manifest.path if manifest else manifest_path(version),
            ) from None
        if manifest is not None and manifest.num_keys > 0 and next(iter(db.keys()), None) is None:
            db.close()
            raise CheckpointDamagedError(
                f"the manifest says the version holds {manifest.num_keys} keys, but its restored database is empty",
                store=self.store_dir,
                version=version,
                file=manifest.path if manifest else manifest_path(version),
            )
        write_opts = rocksdict.WriteOptions()
        write_opts.disable_wal = True  # commits ingest files; nothing is written through the WAL
        db.set_write_options(write_opts)
        self.db, self.dir = db, db_dir
        self.set_version(version, manifest)

    def open_empty(self) -> None:
        """A new, empty DB: the state of version 0."""
        self.open(self.fresh_dir("db-0"), 0, None)
        self.snapshot_taken(0, 0)

    def snapshot_taken(self, version: int, stored_bytes: int) -> None:
        """The DB's chain has a snapshot at `version` of `stored_bytes`: replays start there."""
        if self.snapshot_at is not None and version < self.snapshot_at:
            return
        self.snapshot_at, self.snapshot_bytes = version, stored_bytes
        self.changes_bytes = {v: n for v, n in self.changes_bytes.items() if v > version}

    def changes_since_snapshot(self, version: int) -> int:
        """The stored bytes of the changes a restore of `version` would replay after the snapshot."""
        at = self.snapshot_at or 0
        return sum(n for v, n in self.changes_bytes.items() if at < v <= version)

    def set_version(self, version: int, manifest: Manifest | None) -> None:
        self.version = version
        self.manifest_id = manifest.manifest_id if manifest else None
        self.num_keys = manifest.num_keys if manifest else 0
        self.num_internal_keys = manifest.num_internal_keys if manifest else 0

    def forget_version(self) -> None:
        """The DB is being changed: until a commit succeeds it equals no manifest."""
        self.version = self.manifest_id = None

    def drop(self) -> None:
        if self.db is not None:
            self.db.close()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
        self.db = self.dir = self.version = self.manifest_id = None
        self.ancestor = None
        self.snapshot_at = None
        self.snapshot_bytes = 0
        self.changes_bytes = {}

    def holds(self, m: Manifest) -> bool:
        return self.db is not None and self.version == m.version and self.manifest_id == m.manifest_id

    def is_empty(self) -> bool:
        assert self.db is not None
        return next(iter(self.db.keys()), None) is None

    def fresh_dir(self, label: str) -> Path:
        d = self.work_dir / f"{label}-{uuid.uuid4().hex[:8]}"
        d.mkdir()
        return d

    def checkpoint(self, target: Path) -> None:
        """A RocksDB checkpoint (hard links) of the DB at `target`: a view, or what a snapshot is made from."""
        assert self.db is not None
        rocksdict.Checkpoint(self.db).create_checkpoint(str(target))

    def ingest(self, *change_files: Path) -> None:
        """Moves the SSTs into the DB in one ingest; where they overlap, later files win."""
        assert self.db is not None
        ingest = rocksdict.IngestExternalFileOptions()
        ingest.set_move_files(True)
        self.db.ingest_external_file([str(f) for f in change_files], ingest)

    def write_change_file(
        self, batches: Iterable[pa.RecordBatch], version: int, *, also: changelog.SegmentWriter | None = None
    ) -> Path | None:
        """Writes a version's changes (batches in key order) as one SST file (puts, and deletes as
        tombstones), to be ingested into the DB: no memtable to fill and no flush, so a large commit
        costs the worker a data block of memory, not the whole batch. Each batch also goes to `also`
        (the changelog segment). None when there are no changes."""
        path = self.work_dir / f"changes-{version}-{uuid.uuid4().hex[:8]}.sst"
        writer: rocksdict.SstFileWriter | None = None
        try:
            for chunk in batches:
                if not chunk.num_rows:
                    continue
                if also is not None:
                    also.write(chunk)
                if writer is None:
                    writer = rocksdict.SstFileWriter(self.options(create=True))
                    writer.open(str(path))
                ops = chunk.column(0).to_pylist()
                keys = chunk.column(1).to_pylist()
                values = chunk.column(2).to_pylist()
                for op, key, value in zip(ops, keys, values, strict=True):
                    if op == frames.OP_PUT:
                        writer[key] = value
                    elif op == frames.OP_DELETE:
                        del writer[key]
                    else:
                        raise StoreConfigError(
                            f"unknown op {op} in the change frame", store=self.store_dir, version=version
                        )
                del ops, keys, values
            if writer is None:
                return None
            writer.finish()
            return path
        except Exception as e:
            path.unlink(missing_ok=True)
            if isinstance(e, (StoreConfigError, changelog.SegmentFormatError)):
                raise  # our own errors; a damaged segment says "offsets out of order" itself
            if "order" in str(e).lower():  # RocksDB: keys must be added in strict ascending order
                raise StoreConfigError(
                    "the change frame is not sorted by key (or repeats a key)",
                    store=self.store_dir,
                    version=version,
                    advice="The JVM shim and the Python package are of different pystatestore releases; install "
                    "the same release for both.",
                ) from None
            raise

    def close(self) -> None:
        self.drop()
        shutil.rmtree(self.work_dir, ignore_errors=True)


def link_or_copy(src: Path, dst: Path, *, link: bool) -> None:
    """SSTs are immutable, so a hard link shares them safely with the local copy; RocksDB rewrites
    its other files on open, so those are copied."""
    if link:
        try:
            os.link(src, dst)
            return
        except OSError:
            pass
    shutil.copy2(src, dst)


def take_local_file(src: Path, dst: Path, *, link: bool) -> bool:
    """`link_or_copy` of a file from a local recovery copy; False when the copy's file is gone.
    Copies are shared by every instance of a store on the host (a retried or speculative task of
    the same partition), and another instance's commit may prune a copy this one is restoring
    from: the caller then takes that state from the checkpoint instead."""
    try:
        link_or_copy(src, dst, link=link)
        return True
    except FileNotFoundError:
        dst.unlink(missing_ok=True)
        return False
