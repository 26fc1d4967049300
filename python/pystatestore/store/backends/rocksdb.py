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

The local DB is trusted for reuse only while it is exactly the state of one manifest (same version
and same manifest id). SST names are local to a DB lineage, so a file name may only be matched
against the snapshot the local DB descends from (`_ancestor`), and only while that snapshot is the
one the version's chain resolves to (so garbage collection keeps it).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import rocksdict

from .. import changelog, frames
from ..errors import CheckpointDamagedError, CheckpointMissingError, StoreConfigError
from ..leases import CommitLease
from ..local_recovery import DEFAULT_VERSIONS_KEPT, LocalRecoveryStore, clean_stale_stores, default_root
from ..manifest import (
    KEY_ENCODING_PREFIX,
    KEY_ENCODING_RAW,
    KIND_SNAPSHOT,
    MANIFEST_DIR,
    SNAPSHOT_DIR,
    ChangesRef,
    FileRef,
    Manifest,
    manifest_path,
    snapshot_of,
    snapshot_path,
    version_of_manifest,
)
from ..remote import RemoteStore, local_file_in
from ..transfer import TransferStats, download_all, upload_all, upload_file
from .base import CommitResult, LoadResult, StateBackend, elapsed_ms

log = logging.getLogger("pystatestore.rocksdb")
DEFAULT_TRANSFER_THREADS = 4
DEFAULT_L0_COMPACTION_TRIGGER = 8
# Table format the JVM's reader understands: Spark 4.1 ships rocksdbjni 9.8.4, older than the
# RocksDB inside rocksdict (10.x). Format 5 is read by every RocksDB since 6.6.
TABLE_FORMAT_VERSION = 5
BLOOM_BITS_PER_KEY = 10  # point lookups in the JVM skip files that cannot hold the key
METADATA_BLOCK_BYTES = 4096  # index and filter partitions
# RocksDB's MANIFEST grows by every flush and compaction until it reaches this size, then starts
# anew with the current state only: kept small so it can be stored inside our manifests.
MAX_ROCKSDB_MANIFEST_BYTES = 64 << 10
APPLY_CHUNK_ROWS = 16384
# Replay merges consecutive versions' changes into one SST while their segments add up to this:
# merging holds the versions whole, about 12 bytes of memory per byte of segment.
REPLAY_MERGE_BYTES = 256 << 10
# Replayed versions' SSTs go into the local DB in ingests of at most this many files.
REPLAY_INGEST_FILES = 8
# The worker serves no reads (the JVM reads views), so its cache only holds what compactions and
# restores touch: small, shared by every store in the worker.
WORKER_BLOCK_CACHE_BYTES = 2 << 20
STALE_COPY_SCAN_INTERVAL_S = 3600.0
COMMIT_MODES = ("changelog", "snapshot")
DEFAULT_COMMIT_MODE = "changelog"
# Files (and changelog segments) up to this size are stored inside the manifest.
DEFAULT_INLINE_BYTES = 16 << 10
# Maintenance snapshots a store whose SSTs add up to at most this much as one segment of its whole
# state (a compact snapshot) rather than as a RocksDB checkpoint.
DEFAULT_COMPACT_SNAPSHOT_BYTES = 1 << 20
# A compact snapshot's segment is stored inside its manifest only up to this size (and the inline
# threshold): base64 adds a third, and a snapshot is made in the background, where the extra file
# costs no commit any latency. At 200 partitions a 500-key snapshot is 6.4 KB as a file, 8.5 KB inline.
COMPACT_SNAPSHOT_INLINE_BYTES = 2 << 10
# Maintenance also makes a snapshot once the changes since the last one add up to this much.
DEFAULT_CHANGELOG_MAX_BYTES = 64 << 20
# Changelog commits keep a local recovery copy every this many versions (staggered across
# partitions so each batch pays for a share of them): a copy costs a commit about as much as its
# own RocksDB work, while a restore replays at most this many minus one versions' changes, which
# the manifests usually hold inline.
DEFAULT_LOCAL_RECOVERY_INTERVAL = 4
_shared_cache_lock = threading.Lock()
_shared_cache: rocksdict.Cache | None = None
_last_stale_scan: dict[Path, float] = {}


def _block_cache() -> rocksdict.Cache:
    """One block cache for every store in the worker, so memory does not grow with partitions."""
    global _shared_cache
    with _shared_cache_lock:
        if _shared_cache is None:
            _shared_cache = rocksdict.Cache(WORKER_BLOCK_CACHE_BYTES)
        return _shared_cache


# The commit steps whose times a manifest records (`Manifest.commit_ms`; the report plots them).
_TIMED_STEPS = ("restoreMs", "applyMs", "flushMs", "checkpointMs", "uploadMs")


def _link_or_copy(src: Path, dst: Path, *, link: bool) -> None:
    """SSTs are immutable, so a hard link shares them safely with the local copy; RocksDB rewrites
    its other files on open, so those are copied."""
    if link:
        try:
            os.link(src, dst)
            return
        except OSError:
            pass
    shutil.copy2(src, dst)


def _take_local_file(src: Path, dst: Path, *, link: bool) -> bool:
    """`_link_or_copy` of a file from a local recovery copy; False when the copy's file is gone.
    Copies are shared by every instance of a store on the host (a retried or speculative task of
    the same partition), and another instance's commit may prune a copy this one is restoring
    from: the caller then takes that state from the checkpoint instead."""
    try:
        _link_or_copy(src, dst, link=link)
        return True
    except FileNotFoundError:
        dst.unlink(missing_ok=True)
        return False


@dataclass
class Materialization:
    """A snapshot of the newest changelog version being made by maintenance: prepared under the
    store's lock (a checkpoint: hard links), uploaded without it, so commits do not wait."""

    manifest: Manifest  # the changelog manifest being materialized
    checkpoint_dir: Path
    reuse_from: Manifest | None  # the snapshot whose files the local DB still holds
    db_dir: Path  # the local DB it came from: it becomes that DB's ancestor only if unchanged
    snapshot: Manifest | None = None
    metrics: dict[str, int] = field(default_factory=dict)


@dataclass
class _Restore:
    """What `_ensure_at` did: where the state came from and what it cost."""

    metrics: dict[str, int] = field(default_factory=dict)
    local_files: int = 0
    local_bytes: int = 0
    remote: TransferStats = TransferStats(0, 0)
    replayed: int = 0
    replayed_bytes: int = 0
    inline_snapshots: int = 0  # state read from inside a snapshot manifest: no file of its own
    inline_bytes: int = 0  # segments read from inside manifests (which come from the checkpoint)


class RocksDBBackend(StateBackend):
    name = "rocksdb"
    read_path = "view"
    key_encodings = (KEY_ENCODING_RAW, KEY_ENCODING_PREFIX)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        opts = self.ctx.options
        self.mode = opts.get("commitMode", DEFAULT_COMMIT_MODE)
        if self.mode not in COMMIT_MODES:
            raise StoreConfigError(
                f"commitMode={self.mode!r} is not one of {', '.join(COMMIT_MODES)}",
                store=self.ctx.store_dir,
                advice="Set spark.sql.streaming.stateStore.pystatestore.commitMode to changelog or snapshot.",
            )
        self.inline_bytes = self._int_option("inlineThresholdBytes", DEFAULT_INLINE_BYTES, minimum=0)
        self.changelog_max_bytes = self._int_option("changelogMaxBytes", DEFAULT_CHANGELOG_MAX_BYTES, minimum=1)
        self.compact_snapshot_bytes = self._int_option(
            "compactSnapshotMaxBytes", DEFAULT_COMPACT_SNAPSHOT_BYTES, minimum=0
        )
        self.threads = self._int_option("transferThreads", DEFAULT_TRANSFER_THREADS, minimum=1)
        self.l0_trigger = self._int_option("rocksdb.l0CompactionTrigger", DEFAULT_L0_COMPACTION_TRIGGER, minimum=1)
        base = Path(self.ctx.local_dir or tempfile.gettempdir()) / "rocksdb"
        base.mkdir(parents=True, exist_ok=True)
        self.work_dir = Path(tempfile.mkdtemp(prefix=f"op{self.ctx.operator_id}-p{self.ctx.partition_id}-", dir=base))
        self.local_copies: LocalRecoveryStore | None = None
        if opts.get("localRecovery", "true").lower() == "true":
            self.local_copies = LocalRecoveryStore(
                Path(opts.get("localRecoveryDir") or default_root(self.ctx.host_dir)),
                self.ctx.store_dir,
                self._int_option("localRecoveryVersions", DEFAULT_VERSIONS_KEPT, minimum=1),
                hook=self._fault_point,
            )
        self.local_copy_interval = self._int_option("localRecoveryInterval", DEFAULT_LOCAL_RECOVERY_INTERVAL, minimum=1)
        self._db: rocksdict.Rdict | None = None
        self._db_dir: Path | None = None
        self._db_version: int | None = None  # the committed version the local DB holds exactly
        self._db_manifest_id: str | None = None  # None for version 0 (no manifest)
        self._db_num_keys = 0
        # The snapshot manifest whose files (by local name) the local DB still holds: what a new
        # snapshot of this DB may reuse instead of uploading. None for a DB of unknown descent.
        self._ancestor: Manifest | None = None
        # The newest version of the local DB's chain known to have a snapshot (0: the chain starts
        # at version 1), so a commit can tell that one is due without reading the checkpoint.
        self._snapshot_at: int | None = None

    def _int_option(self, name: str, default: int, *, minimum: int) -> int:
        raw = self.ctx.options.get(name)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise StoreConfigError(
                f"{name}={raw!r} is not a whole number of at least {minimum}",
                store=self.ctx.store_dir,
                advice=f"Fix or unset spark.sql.streaming.stateStore.pystatestore.{name}.",
            )
        return value

    # -- local DB --------------------------------------------------------------------------
    def _options(self, *, create: bool) -> rocksdict.Options:
        opts = rocksdict.Options(raw_mode=True)
        opts.create_if_missing(create)
        opts.set_level_zero_file_num_compaction_trigger(self.l0_trigger)
        opts.set_level_zero_slowdown_writes_trigger(max(20, self.l0_trigger * 3))
        opts.set_level_zero_stop_writes_trigger(max(36, self.l0_trigger * 5))
        opts.set_compression_type(rocksdict.DBCompressionType.lz4())
        opts.set_max_manifest_file_size(MAX_ROCKSDB_MANIFEST_BYTES)
        table = rocksdict.BlockBasedOptions()
        table.set_block_cache(_block_cache())
        table.set_format_version(TABLE_FORMAT_VERSION)
        table.set_bloom_filter(BLOOM_BITS_PER_KEY, False)
        table.set_cache_index_and_filter_blocks(True)
        # Partitioned index and filters (4 KiB blocks under a small pinned top level): a whole-file
        # filter of a large SST does not fit a block cache shard, and the JVM's bounded cache
        # thrashed on them (every lookup of a new key re-read a file's filter).
        table.set_index_type(rocksdict.BlockBasedIndexType.two_level_index_search())
        table.set_partition_filters(True)
        table.set_metadata_block_size(METADATA_BLOCK_BYTES)
        table.set_pin_top_level_index_and_filter(True)
        opts.set_block_based_table_factory(table)
        opts.set_write_buffer_size(16 << 20)
        return opts

    def _open(self, db_dir: Path, version: int, manifest: Manifest | None) -> None:
        """Opens `db_dir` as the local DB of `version`. Only version 0 may start empty: a DB restored
        for a manifest must exist, and must hold keys when the manifest says it does."""
        self._drop_db()
        try:
            db = rocksdict.Rdict(str(db_dir), self._options(create=manifest is None))
        except Exception as e:  # noqa: BLE001 - rocksdict raises a bare Exception for RocksDB errors
            raise CheckpointDamagedError(
                f"the restored files do not open as a RocksDB database ({e})",
                store=self.ctx.store_dir,
                version=version,
                file=manifest_path(version),
            ) from None
        if manifest is not None and manifest.num_keys > 0 and next(iter(db.keys()), None) is None:
            db.close()
            raise CheckpointDamagedError(
                f"the manifest says the version holds {manifest.num_keys} keys, but its restored database is empty",
                store=self.ctx.store_dir,
                version=version,
                file=manifest_path(version),
            )
        write_opts = rocksdict.WriteOptions()
        write_opts.disable_wal = True  # commits ingest files; nothing is written through the WAL
        db.set_write_options(write_opts)
        self._db, self._db_dir = db, db_dir
        self._set_db_version(version, manifest)

    def _set_db_version(self, version: int, manifest: Manifest | None) -> None:
        self._db_version = version
        self._db_manifest_id = manifest.manifest_id if manifest else None
        self._db_num_keys = manifest.num_keys if manifest else 0

    def _drop_db(self) -> None:
        if self._db is not None:
            self._db.close()
        if self._db_dir is not None:
            shutil.rmtree(self._db_dir, ignore_errors=True)
        self._db = self._db_dir = self._db_version = self._db_manifest_id = None
        self._ancestor = None
        self._snapshot_at = None

    def _fresh_dir(self, label: str) -> Path:
        d = self.work_dir / f"{label}-{uuid.uuid4().hex[:8]}"
        d.mkdir()
        return d

    def _db_is(self, m: Manifest) -> bool:
        return self._db is not None and self._db_version == m.version and self._db_manifest_id == m.manifest_id

    # -- restoring -------------------------------------------------------------------------
    def _ensure_at(self, version: int) -> tuple[Manifest | None, dict[str, int]]:
        """Makes the local DB hold exactly `version`; returns its manifest and what it cost. The
        state starts from the first of these found walking back from `version` along its chain: the
        local DB itself, a verified local copy, a snapshot (the version's own manifest, or one
        maintenance made; files from local copies when they match, else downloaded), or version 0;
        the changes of the versions after it are then replayed (kept on this host when they are,
        else from the checkpoint). A snapshot that is only in the checkpoint is passed over for an
        older local copy when every version in between has its changes on this host (or inside
        its manifest): a restart on the same host then reads nothing from the checkpoint but
        manifests (Flink's local recovery)."""
        if version == 0:
            if self._db_version != 0:
                self._open(self._fresh_dir("db-0"), 0, None)
                self._snapshot_at = 0
            return None, {}
        target = self.read_manifest(version)
        if self._db_is(target):
            return target, {}
        started = time.perf_counter()
        replay: list[Manifest] = []
        restore = _Restore()
        copies: dict[int, str] = {}  # version -> manifest id of each local copy
        if self.local_copies is not None:
            self.local_copies.drop_superseded(target.version, target.manifest_id)
            copies = {c.version: c.manifest_id for c in self.local_copies.copies()}
        # A snapshot in the checkpoint passed over for an older local copy, and how many of the
        # versions to replay come after it (taken instead if the walk finds no usable copy).
        passed_over: tuple[Manifest, int] | None = None

        def local_path_on(m: Manifest) -> bool:
            """Replaying `m` reads nothing from the checkpoint, and an older local copy may end the walk."""
            return m.is_changelog and self._changes_on_host(m) and any(v < m.version for v in copies)

        chain = self.chain_back(target)
        while True:
            try:
                m = next(chain)
            except StopIteration:
                break
            except (CheckpointMissingError, CheckpointDamagedError):
                # Past a snapshot, garbage collection may already have removed the older chain
                # (or another attempt replaced a version of it): the snapshot passed over it is.
                if passed_over is None:
                    raise
                break
            if self._db_is(m):
                passed_over = None
                break  # the local DB is a version this chain passes through: replay the rest
            copy = (
                self.local_copies.verified_copy(m.version, m.manifest_id)
                if self.local_copies is not None and copies.get(m.version) == m.manifest_id
                else None
            )
            if copy is not None and self._restore_from_copy(m, copy, restore):
                passed_over = None
                break
            if passed_over is not None:
                if local_path_on(m):
                    replay.append(m)
                    continue
                break  # going further would read the checkpoint: take the snapshot passed over
            snapshot = m if not m.is_changelog else self.read_snapshot(m.version, m.manifest_id)
            if snapshot is not None:
                if local_path_on(m):
                    passed_over = (snapshot, len(replay))
                    replay.append(m)
                    continue
                self._restore_snapshot(snapshot, restore)
                break
            replay.append(m)
            if m.base_version == 0:
                self._open(self._fresh_dir("db-0"), 0, None)
                self._snapshot_at = 0
                break
        if passed_over is not None:
            snapshot, after = passed_over
            del replay[after:]
            self._restore_snapshot(snapshot, restore)
        self._replay(list(reversed(replay)), restore)
        if replay and target.num_keys > 0 and next(iter(self._db.keys()), None) is None:
            self._drop_db()
            raise CheckpointDamagedError(
                f"the manifest says the version holds {target.num_keys} keys, but replaying its changes left none",
                store=self.ctx.store_dir,
                version=target.version,
                file=manifest_path(target.version),
            )
        self._set_db_version(target.version, target)
        restore.metrics.update(
            restoreLocalFiles=restore.local_files,
            restoreLocalBytes=restore.local_bytes,
            restoreRemoteFiles=restore.remote.files,
            restoreRemoteBytes=restore.remote.bytes,
            restoreChangelogVersions=restore.replayed,
            restoreChangelogBytes=restore.replayed_bytes,
            restoreInlineSnapshots=restore.inline_snapshots,
            restoreInlineBytes=restore.inline_bytes,
            restoreMs=elapsed_ms(started),
        )
        return target, restore.metrics

    def _restore_snapshot(self, snapshot: Manifest, restore: _Restore) -> None:
        if snapshot.changes is not None:
            self._restore_compact_snapshot(snapshot, restore)
            return
        db_dir = self._fresh_dir(f"db-{snapshot.version}")
        try:
            local_files, local_bytes, stats = self._restore_files(snapshot, db_dir)
            self._open(db_dir, snapshot.version, snapshot)
        except BaseException:
            shutil.rmtree(db_dir, ignore_errors=True)  # a failed restore leaves nothing behind
            raise
        self._ancestor = snapshot
        self._snapshot_at = snapshot.version
        restore.local_files += local_files
        restore.local_bytes += local_bytes
        restore.remote = TransferStats(restore.remote.files + stats.files, restore.remote.bytes + stats.bytes)

    def _restore_compact_snapshot(self, snapshot: Manifest, restore: _Restore) -> None:
        """A snapshot that holds the whole state as one segment: an empty DB plus that segment,
        ingested as one SST."""
        assert snapshot.changes is not None
        self._open(self._fresh_dir(f"db-{snapshot.version}"), 0, None)
        where = snapshot.changes.ref.path or snapshot_path(snapshot.version, snapshot.manifest_id)
        self._apply_segment(snapshot, f"the state of snapshot {snapshot.version}", where, restore)
        if snapshot.num_keys > 0 and next(iter(self._db.keys()), None) is None:
            self._drop_db()
            raise CheckpointDamagedError(
                f"snapshot {snapshot.version} says it holds {snapshot.num_keys} keys, but its state is empty",
                store=self.ctx.store_dir,
                version=snapshot.version,
                file=snapshot_path(snapshot.version, snapshot.manifest_id),
            )
        self._set_db_version(snapshot.version, snapshot)
        self._ancestor = None  # the local DB's files descend from no uploaded snapshot
        self._snapshot_at = snapshot.version
        if snapshot.changes.ref.inline:
            restore.inline_snapshots += 1

    def _compact_snapshot_of(self, checkpoint_dir: Path, m: Manifest, token: str) -> tuple[Manifest, list[FileRef]]:
        """A snapshot of a small store as one segment of its whole state (every pair, as puts),
        stored inline or under changelog/: a few bytes a row, where a RocksDB checkpoint costs its
        SSTs' index and filter blocks and an OPTIONS file besides."""
        opts = rocksdict.Options(raw_mode=True)
        opts.create_if_missing(False)
        db = rocksdict.Rdict(str(checkpoint_dir), opts, access_type=rocksdict.AccessType.read_only())
        segment = self.work_dir / f"state-{m.version}-{uuid.uuid4().hex[:8]}"
        try:
            rows = changelog.write_segment(segment, _state_batches(db))
            inline_limit = min(self.inline_bytes, COMPACT_SNAPSHOT_INLINE_BYTES)
            changes, uploaded = self._store_changes(segment, rows, m.version, token, inline_limit)
        finally:
            db.close()
            segment.unlink(missing_ok=True)
        snapshot = replace(
            self.new_manifest(m.version, m.num_keys, m.attempt_id),
            manifest_id=m.manifest_id,
            kind=KIND_SNAPSHOT,
            changes=changes,
        )
        return snapshot, uploaded

    def _restore_from_copy(self, m: Manifest, copy: dict[str, Path], restore: _Restore) -> bool:
        """The local DB from the verified local copy `copy` of version `m`. False, with nothing left
        behind, when the copy was pruned part way (see `_take_local_file`)."""
        db_dir = self._fresh_dir(f"db-{m.version}")
        files, size = 0, 0
        try:
            for name, src in copy.items():
                dst = db_dir / name
                if not _take_local_file(src, dst, link=name.endswith(".sst")):
                    log.warning(
                        "local recovery copy %s of store %s (version %d) was removed while it was being "
                        "restored (another instance of the store on this host pruned it); restoring from "
                        "the checkpoint instead",
                        src.parent,
                        self.ctx.store_dir,
                        m.version,
                    )
                    shutil.rmtree(db_dir, ignore_errors=True)
                    return False
                files, size = files + 1, size + dst.stat().st_size
                self._fault_point("restore:file")
            self._open(db_dir, m.version, m)
        except BaseException:
            shutil.rmtree(db_dir, ignore_errors=True)
            raise
        restore.local_files += files
        restore.local_bytes += size
        # The copy's files carry the names of the lineage that wrote it: a snapshot of that version
        # lists them; for a changelog version nothing says which snapshot's files they are.
        self._ancestor = None if m.is_changelog else m
        self._snapshot_at = None if m.is_changelog else m.version  # a changelog copy: unknown until looked up
        return True

    def _restore_files(self, manifest: Manifest, db_dir: Path) -> tuple[int, int, TransferStats]:
        """Puts every file of snapshot `manifest` into `db_dir`: stored inside the manifest, from
        local copies when they match, else downloaded. Every logical name is checked to be a plain
        file name before it is used."""
        version = manifest.version
        local_files, local_bytes = 0, 0
        missing: list[tuple[FileRef, str]] = []
        if self.local_copies is not None:
            self.local_copies.drop_superseded(version, manifest.manifest_id)
        for name, ref in {**manifest.shared, **manifest.private}.items():
            target = Path(local_file_in(db_dir, name, store=self.ctx.store_dir, version=version))
            if ref.inline:
                target.write_bytes(ref.content(store=self.ctx.store_dir, version=version, name=name))
                continue
            found = (
                self.local_copies.find(name, ref, version=version, manifest_id=manifest.manifest_id)
                if self.local_copies
                else None
            )
            if found is None or not _take_local_file(found, target, link=name.endswith(".sst")):
                missing.append((ref, name))
                continue
            local_files, local_bytes = local_files + 1, local_bytes + ref.size
            self._fault_point("restore:file")
        stats = download_all(self.remote, missing, db_dir, self.threads, version=version, hook=self._fault_point)
        return local_files, local_bytes, stats

    def _replay(self, chain: list[Manifest], restore: _Restore) -> None:
        """Applies the changes of `chain` (oldest first) to the local DB, which holds the version
        before the first. An ingest costs its fsyncs whatever its size, and a restart restores every
        partition, so replayed versions are ingested together: up to REPLAY_INGEST_FILES SSTs in one
        call (where files overlap, a later one's entries win). Each SST holds one version's changes,
        streamed chunk by chunk from its segment, or the merged changes of consecutive small
        versions (segments adding up to at most REPLAY_MERGE_BYTES; newest change per key), since
        merging holds them whole. On failure the local DB is dropped: it matches no version."""
        units: list[list[Manifest]] = []  # the versions of each SST to write
        unit_bytes = 0
        for m in chain:
            assert m.changes is not None
            size = m.changes.ref.size
            if units and unit_bytes + size <= REPLAY_MERGE_BYTES:
                units[-1].append(m)
                unit_bytes += size
            else:
                units.append([m])
                unit_bytes = size
        for first in range(0, len(units), REPLAY_INGEST_FILES):
            self._replay_units(units[first : first + REPLAY_INGEST_FILES], restore)

    def _replay_units(self, units: list[list[Manifest]], restore: _Restore) -> None:
        files: list[Path] = []
        try:
            for unit in units:
                change_file = self._write_change_file(self._unit_batches(unit, restore), unit[-1].version)
                if change_file is not None:
                    files.append(change_file)
            self._fault_point("restore:replayed")
            if files:
                self._ingest(*files)
        except BaseException:
            self._drop_db()
            raise
        finally:
            for f in files:
                f.unlink(missing_ok=True)  # ingested files were moved into the DB
        for unit in units:
            restore.replayed += len(unit)
            restore.replayed_bytes += sum(m.changes.ref.size for m in unit if m.changes)

    def _unit_batches(self, unit: list[Manifest], restore: _Restore) -> Iterator[pa.RecordBatch]:
        """The changes of one replayed SST, in key order: one version's segment as it is read, or
        consecutive versions merged."""
        if len(unit) == 1:
            return self._segment_batches(unit[0], restore=restore)
        tables = [
            pa.Table.from_batches(list(self._segment_batches(m, restore=restore)), frames.CHANGES_SCHEMA) for m in unit
        ]
        return frames.change_batches(_newest_change_per_key(tables), APPLY_CHUNK_ROWS)

    def _segment_batches(
        self,
        m: Manifest,
        described: str | None = None,
        where: str | None = None,
        *,
        restore: _Restore | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """The segment `m` holds (a version's changes, or a compact snapshot's state), chunk by
        chunk; a damaged one raises an error naming `described` and `where` it is stored. Where
        it came from is counted in `restore`."""
        try:
            yield from changelog.read_segment(self._changes_of(m, restore))
        except changelog.SegmentFormatError as e:
            raise self._not_a_segment(
                m, described or f"the changes of version {m.version}", where or self._changes_where(m), e
            ) from None

    def _apply_segment(self, m: Manifest, described: str, where: str, restore: _Restore) -> None:
        """Ingests the segment `m` holds (a compact snapshot's state) into the local DB as one SST.
        On any failure the local DB is dropped: it matches no version."""
        change_file: Path | None = None
        try:
            batches = self._segment_batches(m, described, where, restore=restore)
            change_file = self._write_change_file(batches, m.version)
            if change_file is not None:
                self._ingest(change_file)
        except BaseException:
            self._drop_db()
            raise
        finally:
            if change_file is not None:
                change_file.unlink(missing_ok=True)  # moved into the DB when ingested

    @staticmethod
    def _changes_where(m: Manifest) -> str:
        """Where a changelog version's changes are stored: their own file, or inside its manifest."""
        return (m.changes.ref.path if m.changes else "") or manifest_path(m.version)

    def _not_a_segment(self, m: Manifest, described: str, where: str, e: Exception) -> CheckpointDamagedError:
        return CheckpointDamagedError(
            f"{described} is not a changelog segment ({e})", store=self.ctx.store_dir, version=m.version, file=where
        )

    def _changes_of(self, m: Manifest, restore: _Restore | None = None) -> bytes:
        """A segment (a changelog version's changes, or a compact snapshot's state): from inside its
        manifest, from the changes kept on this host (changelog versions; size and checksum checked
        against the manifest), or downloaded and verified. Files are counted in `restore`."""
        assert m.changes is not None
        ref = m.changes.ref
        if ref.inline:
            if restore is not None:
                restore.inline_bytes += ref.size
            return ref.content(store=self.ctx.store_dir, version=m.version, name="changes")
        if m.is_changelog and self.local_copies is not None:
            kept = self.local_copies.read_changes(m.version, m.manifest_id, ref)
            if kept is not None:
                if restore is not None:
                    restore.local_files += 1
                    restore.local_bytes += len(kept)
                return kept
        tmp = self._fresh_dir(f"changes-{m.version}")
        try:
            stats = download_all(self.remote, [(ref, "segment")], tmp, 1, version=m.version, hook=self._fault_point)
            if restore is not None:
                restore.remote = TransferStats(restore.remote.files + stats.files, restore.remote.bytes + stats.bytes)
            return (tmp / "segment").read_bytes()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _changes_on_host(self, m: Manifest) -> bool:
        """Whether replaying changelog version `m` needs nothing from the checkpoint: its changes are
        inside its manifest, or kept on this host."""
        if m.changes is None:
            return False
        ref = m.changes.ref
        return ref.inline or (
            self.local_copies is not None and self.local_copies.has_changes(m.version, m.manifest_id, ref)
        )

    # -- reading ---------------------------------------------------------------------------
    def load(self, version: int, view_dir: str | None = None) -> LoadResult:
        """Makes the local DB hold `version` and leaves it as a read view at `view_dir` (a RocksDB
        checkpoint: hard links). Nothing proportional to the number of keys is read or sent.
        Without `view_dir` (Python callers) only the local DB is brought to `version`."""
        target = self._view_target(view_dir, version) if view_dir is not None else None
        _, cost = self._ensure_at(version)
        return self._leave_view(target, cost)

    def _leave_view(self, target: Path | None, cost: dict[str, int]) -> LoadResult:
        assert self._db is not None
        if target is not None:
            t = time.perf_counter()
            rocksdict.Checkpoint(self._db).create_checkpoint(str(target))
            cost = {**cost, "viewMs": elapsed_ms(t)}
        if "restoreMs" not in cost:
            source = "memory"
        elif cost["restoreRemoteFiles"] == 0 and cost["restoreLocalFiles"] > 0:
            source = "local-copy"
        elif cost["restoreLocalFiles"] == cost["restoreRemoteFiles"] == cost.get("restoreInlineSnapshots", 0) == 0:
            source = "changelog"  # changes replayed onto the local DB, or onto version 0
        else:
            source = "remote" if cost["restoreLocalFiles"] == 0 else "local-copy+remote"
        return LoadResult(
            None,
            self._db_num_keys,
            cost.get("restoreRemoteBytes", 0) + cost.get("restoreInlineBytes", 0),
            source,
            cost,
            manifest_id=self._db_manifest_id or "",
        )

    def replay(self, snapshot_version: int, end_version: int, view_dir: str | None = None) -> LoadResult:
        """Spark's replayStateFromSnapshot: the state of `end_version` built from the snapshot of
        `snapshot_version` (which must exist) and the changes after it, bypassing every shortcut
        (local DB, local copies of later versions), e.g. to get around a damaged later snapshot."""
        target = self._view_target(view_dir, end_version) if view_dir is not None else None
        started = time.perf_counter()
        end = self.read_manifest(end_version)
        chain: list[Manifest] = []
        base: Manifest | None = None
        for m in self.chain_back(end):
            if m.version == snapshot_version:
                base = m if not m.is_changelog else self.read_snapshot(m.version, m.manifest_id)
                break
            chain.append(m)
        if base is None:
            raise self._no_snapshot(snapshot_version, end_version)
        restore = _Restore()
        self._restore_snapshot(base, restore)
        self._replay(list(reversed(chain)), restore)
        self._set_db_version(end.version, end)
        cost = {
            "restoreLocalFiles": restore.local_files,
            "restoreLocalBytes": restore.local_bytes,
            "restoreRemoteFiles": restore.remote.files,
            "restoreRemoteBytes": restore.remote.bytes,
            "restoreChangelogVersions": restore.replayed,
            "restoreChangelogBytes": restore.replayed_bytes,
            "restoreInlineSnapshots": restore.inline_snapshots,
            "restoreInlineBytes": restore.inline_bytes,
            "restoreMs": elapsed_ms(started),
        }
        return self._leave_view(target, cost)

    def _no_snapshot(self, snapshot_version: int, end_version: int) -> StoreConfigError:
        have = self.snapshot_versions()
        return StoreConfigError(
            f"there is no snapshot of version {snapshot_version} to replay version {end_version} from "
            f"(snapshots: {', '.join(map(str, have[-20:])) or 'none'})",
            store=self.ctx.store_dir,
            version=snapshot_version,
            file=manifest_path(snapshot_version),
            advice="Pick a snapshotStartBatchId whose version (batch id + 1) has a snapshot, or read without it.",
        )

    def snapshot_versions(self) -> list[int]:
        """Versions that have a snapshot (their own manifest, or one maintenance made)."""
        found = set()
        for f in self.remote.list_files(MANIFEST_DIR):
            v = version_of_manifest(f.path)
            if v is not None:
                try:
                    if not self.read_manifest(v).is_changelog:
                        found.add(v)
                except (CheckpointDamagedError, StoreConfigError, OSError):
                    continue
        for f in self.remote.list_files(SNAPSHOT_DIR):
            key = snapshot_of(f.path)
            if key is not None:
                found.add(key[0])
        return sorted(found)

    def changes(self, start_version: int, end_version: int) -> Iterator[tuple[int, pa.RecordBatch]]:
        """The change feed: each version's changes (op, key, value), start to end inclusive."""
        for v in range(start_version, end_version + 1):
            m = self.read_manifest(v)
            if not m.is_changelog:
                raise StoreConfigError(
                    f"version {v} was committed as a snapshot, which records no changes",
                    store=self.ctx.store_dir,
                    version=v,
                    file=manifest_path(v),
                    advice="The change feed needs changelog commits: read from a batch committed with "
                    "spark.sql.streaming.stateStore.pystatestore.commitMode=changelog (the default).",
                )
            yield from ((v, b) for b in self._segment_batches(m))

    def _view_target(self, view_dir: str | None, version: int) -> Path:
        """`view_dir`, checked to be a new directory directly inside the JVM's views directory: the
        worker writes nowhere else on the JVM's behalf."""
        if not view_dir or not self.ctx.views_dir:
            raise StoreConfigError(
                "the rocksdb backend is read through views, but no view directory was given",
                store=self.ctx.store_dir,
                version=version,
                advice="The JVM shim and the Python package are of different pystatestore releases; install the "
                "same release for both.",
            )
        target = Path(os.path.abspath(view_dir))
        if target.parent != Path(os.path.abspath(self.ctx.views_dir)) or os.path.lexists(target):
            raise StoreConfigError(
                f"view directory {view_dir} is not a new directory inside {self.ctx.views_dir}",
                store=self.ctx.store_dir,
                version=version,
            )
        return target

    # -- writing ---------------------------------------------------------------------------
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
        version = base_version + 1
        if num_keys is None or num_keys < 0:
            raise StoreConfigError(
                "a rocksdb commit needs the new version's key count from the JVM",
                store=self.ctx.store_dir,
                version=version,
                advice="The JVM shim and the Python package are of different pystatestore releases; install the "
                "same release for both.",
            )
        checkpoint_dir = (
            self._view_target(view_dir, version)
            if view_dir is not None
            else self.work_dir / f"ckpt-{version}-{uuid.uuid4().hex[:8]}"
        )
        with self.commit_attempt(version) as lease:
            if base_version > 0 and self.remote.exists(manifest_path(version)):
                # Spark re-runs an older batch (or retries one that was durable): the base may already
                # be below the retained versions, so keep GC off it while this attempt runs.
                lease.pin_base(base_version)
            return self._commit_under(
                lease, base_version, changes, attempt_id, base_manifest_id, num_keys, checkpoint_dir, view_dir
            )

    def _commit_under(
        self,
        lease: CommitLease,
        base_version: int,
        changes: frames.Changes,
        attempt_id: str,
        base_manifest_id: str | None,
        num_keys: int,
        checkpoint_dir: Path,
        view_dir: str | None,
    ) -> CommitResult:
        version = base_version + 1
        base, load_cost = self._ensure_at(base_version)
        self.check_base(base_version, base.manifest_id if base else "", base_manifest_id)
        assert self._db is not None
        # From here on the local DB no longer equals any manifest until this commit succeeds.
        self._db_version = self._db_manifest_id = None
        metrics: dict[str, int] = {**load_cost}
        segment_path = self.work_dir / f"segment-{version}-{uuid.uuid4().hex[:8]}" if self.mode == "changelog" else None

        t = time.perf_counter()
        segment = changelog.SegmentWriter(segment_path) if segment_path is not None else None
        try:
            batches = frames.change_batches(frames.sorted_by_key(changes), APPLY_CHUNK_ROWS)
            change_file = self._write_change_file(batches, version, also=segment)
            rows = segment.close() if segment is not None else 0
        except BaseException:
            if segment is not None:
                segment.abort()
            if segment_path is not None:
                segment_path.unlink(missing_ok=True)
            raise
        metrics["applyMs"] = elapsed_ms(t)
        self._fault_point("commit:applied")

        t = time.perf_counter()
        if change_file is not None:
            self._ingest(change_file)
        metrics["flushMs"] = elapsed_ms(t)
        self._fault_point("commit:flushed")

        published = False
        try:
            t = time.perf_counter()
            rocksdict.Checkpoint(self._db).create_checkpoint(str(checkpoint_dir))
            metrics["checkpointMs"] = elapsed_ms(t)
            self._fault_point("commit:checkpointed")
            t = time.perf_counter()
            if segment_path is not None:
                changes_ref, uploaded = self._store_changes(segment_path, rows, version, lease.token, self.inline_bytes)
                manifest = self.new_changelog_manifest(
                    version,
                    num_keys,
                    attempt_id,
                    parent_manifest_id=base.manifest_id if base else "",
                    changes=changes_ref,
                )
            else:
                manifest, uploaded = self._snapshot_of(
                    checkpoint_dir, version, num_keys, attempt_id, lease.token, self._reusable_for(base)
                )
            metrics["uploadMs"] = elapsed_ms(t)
            self._fault_point("commit:uploaded")
            t = time.perf_counter()
            manifest.commit_ms = {k: v for k in _TIMED_STEPS if (v := metrics.get(k)) is not None}
            body = manifest.to_json()
            lease.check_before_publish()
            if lease.base_version is not None and base is not None:
                self._check_base_intact(base)
            self.remote.publish(manifest_path(version), body)  # the commit point
            published = True
            metrics["manifestMs"] = elapsed_ms(t)
            self._fault_point("commit:manifest-written")
            if self.local_copies is not None and self._local_copy_due(version, manifest):
                known = {**manifest.shared, **manifest.private}  # sizes and checksums the copy need not read
                saved = self.local_copies.save(version, manifest.manifest_id, checkpoint_dir, known)
                metrics["localCopySaved"] = int(saved.kept)
                metrics["localCopyBytesCopied"] = saved.bytes_copied
            if self.local_copies is not None and segment_path is not None and uploaded:
                # The changes went to a file of their own (not inside the manifest): keep that file
                # on this host too, so a restore replays them from here. Copies older than the kept
                # window of copies never need the changes before them.
                window = self.local_copy_interval * self.local_copies.versions_kept
                kept = self.local_copies.save_changes(
                    version, manifest.manifest_id, segment_path, drop_through=version - window
                )
                metrics["localCopyBytesCopied"] = metrics.get("localCopyBytesCopied", 0) + kept.bytes_copied
        finally:
            if segment_path is not None:
                segment_path.unlink(missing_ok=True)
            if view_dir is None or not published:
                shutil.rmtree(checkpoint_dir, ignore_errors=True)  # a view only for a published version
        self._set_db_version(version, manifest)
        if not manifest.is_changelog:
            self._ancestor = manifest
            self._snapshot_at = version
        bytes_uploaded = sum(r.size for r in uploaded)
        refs = manifest.shared | manifest.private
        metrics.update(
            filesUploaded=len(uploaded),
            filesReused=sum(1 for r in refs.values() if not r.inline) - len(uploaded),
            filesInline=sum(1 for r in refs.values() if r.inline),
            bytesUploaded=bytes_uploaded,
            changelogRows=manifest.changes.rows if manifest.changes else 0,
        )
        return CommitResult(
            version,
            num_keys,
            bytes_uploaded + len(body),
            len(uploaded) + 1,
            manifest_path(version),
            metrics,
            manifest_id=manifest.manifest_id,
            snapshot=not manifest.is_changelog,
        )

    def _check_base_intact(self, base: Manifest) -> None:
        """Raises CheckpointMissingError unless every file a restore of `base` reads is still there:
        garbage collection that planned before this attempt pinned its base may have removed them,
        and a version published on a removed base could never be loaded."""
        current = self.read_manifest(base.version)
        self.check_base(base.version, current.manifest_id, base.manifest_id)
        snapshots = {key: f for f in self.remote.list_files(SNAPSHOT_DIR) if (key := snapshot_of(f.path))}
        # At an infinite `now` every snapshot is settled: the chain back to the nearest one, what a restore reads.
        needed = self.dependencies(current, snapshots=snapshots, now=math.inf) | {manifest_path(base.version)}
        for path in sorted(needed):
            if not self.remote.exists(path):
                raise CheckpointMissingError(
                    f"version {base.version}, which this commit builds on, lost a file to garbage collection "
                    "while the commit ran (it is older than the versions spark.sql.streaming.minBatchesToRetain keeps)",
                    store=self.ctx.store_dir,
                    version=base.version,
                    file=path,
                    advice="Nothing was published for this attempt. Spark retries the task; if the retry fails the "
                    "same way, the batch being re-run is older than the checkpoint retains: restart the query from "
                    "its newest batch or raise spark.sql.streaming.minBatchesToRetain.",
                )

    def _local_copy_due(self, version: int, manifest: Manifest) -> bool:
        """Snapshot commits keep a copy of every version (an older copy cannot be brought forward);
        changelog commits every `localRecoveryInterval` versions, when the restore from it replays
        the versions in between."""
        if not manifest.is_changelog:
            return True
        return (version + self.ctx.partition_id) % self.local_copy_interval == 0

    def _store_changes(
        self, segment: Path, rows: int, version: int, token: str, inline_limit: int
    ) -> tuple[ChangesRef, list[FileRef]]:
        """The segment inside the manifest when at most `inline_limit` bytes, else uploaded under
        changelog/."""
        size = segment.stat().st_size
        if size <= inline_limit:
            return ChangesRef(rows, FileRef.inline_of(segment.read_bytes())), []
        ref = upload_file(self.remote, segment, f"changelog/{version}-{token}.changes", hook=self._fault_point)
        self._fault_point("upload:file")
        return ChangesRef(rows, ref), [ref]

    def _ingest(self, *change_files: Path) -> None:
        """Moves the SSTs into the local DB in one ingest; where they overlap, later files win."""
        assert self._db is not None
        ingest = rocksdict.IngestExternalFileOptions()
        ingest.set_move_files(True)
        self._db.ingest_external_file([str(f) for f in change_files], ingest)

    def _write_change_file(
        self, batches: Any, version: int, *, also: changelog.SegmentWriter | None = None
    ) -> Path | None:
        """Writes a version's changes (batches in key order) as one SST file (puts, and deletes as
        tombstones), to be ingested into the local DB: no memtable to fill and no flush, so a large
        commit costs the worker a data block of memory, not the whole batch. Each batch also goes to
        `also` (the changelog segment). None when there are no changes."""
        path = self.work_dir / f"changes-{version}-{uuid.uuid4().hex[:8]}.sst"
        writer: rocksdict.SstFileWriter | None = None
        try:
            for chunk in batches:
                if not chunk.num_rows:
                    continue
                if also is not None:
                    also.write(chunk)
                if writer is None:
                    writer = rocksdict.SstFileWriter(self._options(create=True))
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
                            f"unknown op {op} in the change frame", store=self.ctx.store_dir, version=version
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
                raise self._unsorted_frame(version) from None
            raise

    def _unsorted_frame(self, version: int) -> StoreConfigError:
        return StoreConfigError(
            "the change frame is not sorted by key (or repeats a key)",
            store=self.ctx.store_dir,
            version=version,
            advice="The JVM shim and the Python package are of different pystatestore releases; install the same "
            "release for both.",
        )

    # -- snapshots -------------------------------------------------------------------------
    def _reusable_for(self, base: Manifest | None) -> Manifest | None:
        """The snapshot whose files a new snapshot on `base` may reuse: the local DB's ancestor, if
        it is the snapshot `base`'s chain starts from (garbage collection keeps that one)."""
        if base is None or self._ancestor is None:
            return None
        for m in self.chain_back(base):
            if not m.is_changelog:
                resolved = m
            else:
                resolved = self.read_snapshot(m.version, m.manifest_id)
                if resolved is None:
                    continue
            same = resolved.version == self._ancestor.version and resolved.manifest_id == self._ancestor.manifest_id
            return self._ancestor if same else None
        return None

    def _snapshot_of(
        self,
        checkpoint_dir: Path,
        version: int,
        num_keys: int,
        attempt_id: str,
        token: str,
        reuse_from: Manifest | None,
        like: Manifest | None = None,
    ) -> tuple[Manifest, list[FileRef]]:
        """A snapshot manifest of the checkpoint: SSTs and other files `reuse_from` holds with the
        same size (SSTs, by name) or content (others, e.g. OPTIONS) are reused; other small files are
        stored inside the manifest; the rest is uploaded under this attempt's token. `like` gives
        the identity (manifest id, attempt) of the changelog version being materialized."""
        shared: dict[str, FileRef] = {}
        private: dict[str, FileRef] = {}
        to_upload: list[tuple[str, str]] = []
        reusable = {**reuse_from.shared, **reuse_from.private} if reuse_from else {}
        by_content = {(r.size, r.checksum): r for n, r in reusable.items() if not n.endswith(".sst") and not r.inline}
        private_dir = f"private/{version}-{token}"
        for name in sorted(os.listdir(checkpoint_dir)):
            path = checkpoint_dir / name
            size = path.stat().st_size
            if name.endswith(".sst"):
                previous = reusable.get(name)
                if previous is not None and previous.size == size and not previous.inline:
                    shared[name] = previous
                else:
                    to_upload.append((name, f"shared/{token}-{name}"))
                continue
            if name.startswith("OPTIONS"):
                # The same every version: stored once, shared, and reused by content.
                same = by_content.get((size, FileRef.inline_of(path.read_bytes()).checksum))
                if same is not None:
                    shared[name] = same
                else:
                    to_upload.append((name, f"shared/{token}-{name}"))
            elif size <= self.inline_bytes:
                private[name] = FileRef.inline_of(path.read_bytes())
            else:
                to_upload.append((name, f"{private_dir}/{name}"))
        if reuse_from is not None and reuse_from.version != version - 1:
            # An older snapshot than the base: garbage collection keeps it only a grace period after
            # a newer one appears, so make sure its files are still there before relying on them.
            gone = sorted(r.path for n, r in shared.items() if n in reusable and not self.remote.exists(r.path))
            if gone:
                log.warning(
                    "store %s: files of snapshot %d are gone (%s); version %d uploads its own",
                    self.ctx.store_dir,
                    reuse_from.version,
                    ", ".join(gone[:3]),
                    version,
                )
                self._ancestor = None
                return self._snapshot_of(checkpoint_dir, version, num_keys, attempt_id, token, None, like)
        uploaded = upload_all(
            self.remote, [(checkpoint_dir / name, rel) for name, rel in to_upload], self.threads, hook=self._fault_point
        )
        for (name, _), ref in zip(to_upload, uploaded, strict=True):
            (shared if ref.path.startswith("shared/") else private)[name] = ref
        manifest = self.new_manifest(version, num_keys, attempt_id, shared=shared, private=private)
        if like is not None:
            manifest = replace(manifest, manifest_id=like.manifest_id, attempt_id=like.attempt_id, kind=KIND_SNAPSHOT)
        return manifest, uploaded

    def prepare_materialization(self, force: bool = False) -> Materialization | None:
        """Under the store's lock: if the newest version is a changelog version the local DB holds
        and the chain since the last snapshot is long (minDeltasForSnapshot) or large, or it has no
        snapshot and `force` asks for one, a checkpoint of it (hard links) to make its snapshot
        from. Nothing is uploaded here. A chain that cannot be walked (an ancestor was replaced
        after the version was committed on it) gets no snapshot: Spark commits such a version
        again before it reads it, so periodic maintenance skips it and goes on collecting garbage;
        a `force`d snapshot says why it cannot be made."""
        if self.mode != "changelog" or self._db is None or not self._db_version or self._db_dir is None:
            return None
        newest = max((v for f in self.remote.list_files(MANIFEST_DIR) if (v := version_of_manifest(f.path))), default=0)
        if newest != self._db_version:
            return None
        m = self.read_manifest(newest)
        if not m.is_changelog or not self._db_is(m):
            return None
        deltas, size = 0, 0
        try:
            for c in self.chain_back(m):
                if not c.is_changelog or self.remote.exists(snapshot_path(c.version, c.manifest_id)):
                    break
                deltas += 1
                size += c.changes.ref.size if c.changes else 0
            self._snapshot_at = m.version - deltas
            due = deltas >= self.ctx.min_deltas_for_snapshot or size >= self.changelog_max_bytes
            if not (due or (force and deltas > 0)):
                return None
            reuse_from = self._reusable_for(m)
        except (CheckpointDamagedError, CheckpointMissingError) as e:
            if force:
                raise
            log.warning(
                "store %s: no snapshot of version %d: %s (file %s); loading it fails the same way until Spark "
                "commits it again",
                self.ctx.store_dir,
                m.version,
                e.problem,
                e.file,
            )
            return None
        checkpoint_dir = self.work_dir / f"materialize-{m.version}-{uuid.uuid4().hex[:8]}"
        rocksdict.Checkpoint(self._db).create_checkpoint(str(checkpoint_dir))
        return Materialization(m, checkpoint_dir, reuse_from, self._db_dir)

    def finish_materialization(self, job: Materialization) -> None:
        """Without the store's lock: uploads the snapshot and publishes snapshots/<v>-<id>.json."""
        t = time.perf_counter()
        try:
            m = job.manifest
            sst_bytes = sum(p.stat().st_size for p in job.checkpoint_dir.glob("*.sst"))
            with self.commit_attempt(m.version) as lease:
                if sst_bytes <= self.compact_snapshot_bytes:
                    snapshot, uploaded = self._compact_snapshot_of(job.checkpoint_dir, m, lease.token)
                else:
                    snapshot, uploaded = self._snapshot_of(
                        job.checkpoint_dir, m.version, m.num_keys, m.attempt_id, lease.token, job.reuse_from, like=m
                    )
                self._fault_point("materialize:uploaded")
                lease.check_before_publish()
                self.remote.publish(snapshot_path(m.version, m.manifest_id), snapshot.to_json())
            self._fault_point("materialize:published")
            job.snapshot = snapshot
            job.metrics = {
                "materializedVersion": m.version,
                "materializeFilesUploaded": len(uploaded),
                "materializeBytesUploaded": sum(r.size for r in uploaded),
                "materializeMs": elapsed_ms(t),
            }
        finally:
            shutil.rmtree(job.checkpoint_dir, ignore_errors=True)

    def complete_materialization(self, job: Materialization) -> None:
        """Under the store's lock again: the new snapshot becomes the local DB's ancestor if the DB
        is the one it was made from (its files are still there under the same names)."""
        if job.snapshot is not None and self._db_dir == job.db_dir:
            self._ancestor = job.snapshot
            self._snapshot_at = max(self._snapshot_at or 0, job.snapshot.version)

    def snapshot_due(self) -> bool:
        """Whether the local DB's version (just committed) ends a chain of minDeltasForSnapshot
        changelog versions since the last snapshot, or of a length not known here (after a restore
        from a changelog version's local copy): then maintenance should look now."""
        if self.mode != "changelog" or not self._db_version:
            return False
        return self._snapshot_at is None or self._db_version - self._snapshot_at >= self.ctx.min_deltas_for_snapshot

    def maintenance(self, now: float | None = None) -> dict[str, Any]:
        report = super().maintenance(now)
        if self.local_copies is not None:
            report["staleLocalStoresRemoved"] = _scan_stale_copies(self.local_copies.dir.parent.parent)
        return report

    def close(self) -> None:
        self._drop_db()
        shutil.rmtree(self.work_dir, ignore_errors=True)


def _newest_change_per_key(tables: list[pa.Table]) -> pa.Table:
    """The changes of consecutive versions (oldest first) as one frame in key order, holding for
    each key only its newest change: what applying them one after another leaves."""
    seq = [t.append_column("seq", pa.array([i] * t.num_rows, pa.int32())) for i, t in enumerate(tables)]
    ordered = pa.concat_tables(seq).sort_by([("key", "ascending"), ("seq", "descending")])
    keys = ordered.column("key").combine_chunks()
    if len(keys) > 1:
        first = pa.concat_arrays([pa.array([True]), pc.not_equal(keys.slice(1), keys.slice(0, len(keys) - 1))])
        ordered = ordered.filter(first)
    return ordered.drop_columns(["seq"])


def _state_batches(db: rocksdict.Rdict) -> Iterator[pa.RecordBatch]:
    """Every pair of `db` in key order, as put rows of a change frame."""
    keys: list[bytes] = []
    values: list[bytes] = []

    def batch() -> pa.RecordBatch:
        ops = pa.array([frames.OP_PUT] * len(keys), pa.int8())
        return pa.record_batch(
            [ops, pa.array(keys, pa.binary()), pa.array(values, pa.binary())], schema=frames.CHANGES_SCHEMA
        )

    for key, value in db.items():
        keys.append(key)
        values.append(value)
        if len(keys) == APPLY_CHUNK_ROWS:
            yield batch()
            keys, values = [], []
    if keys:
        yield batch()


def _scan_stale_copies(root: Path) -> int:
    """At most hourly per worker: drop local copies of stores whose checkpoint no longer exists."""
    with _shared_cache_lock:
        if time.time() - _last_stale_scan.get(root, 0.0) < STALE_COPY_SCAN_INTERVAL_S:
            return 0
        _last_stale_scan[root] = time.time()

    def store_exists(store_dir: str) -> bool:
        try:
            return RemoteStore(store_dir).exists(MANIFEST_DIR)
        except Exception:  # noqa: BLE001 - unknown or unreachable storage: keep the copies
            return True

    return clean_stale_stores(root, store_exists)
