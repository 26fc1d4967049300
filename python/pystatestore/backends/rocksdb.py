"""The `rocksdb` backend: Flink's incremental RocksDB checkpoints (DESIGN §3, §4), via rocksdict.

Each commit applies the version's changes to a local RocksDB, flushes, takes a native checkpoint
(hard links) and uploads only the SST files that the confirmed base version's manifest does not
already list; the non-SST files (MANIFEST, OPTIONS, CURRENT, ...) are uploaded every time, as
private files. The version's manifest is written last, atomically: it is the commit point.

Python writes, the JVM reads (DESIGN §2): the commit's checkpoint directory is left where the JVM
asked (`view_dir`) as the version's read view, which the JVM opens read-only with Spark's own
rocksdbjni; a load leaves such a view too instead of shipping pairs. The JVM owns view directories
(it deletes them once closed), so nothing here ever prunes a directory the JVM has open. The key
count comes from the JVM, which saw whether each changed key existed: the worker never reads keys.

The local DB is trusted for reuse only while it is exactly the state of one manifest (same
version and same manifest id): SST names are local to a DB lineage, so a file name may only be
matched against the manifest the local DB was built from or committed as.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import rocksdict

from .. import frames
from ..errors import CheckpointDamagedError, StoreConfigError
from ..local_recovery import DEFAULT_VERSIONS_KEPT, LocalRecoveryStore, clean_stale_stores, default_root
from ..manifest import KEY_ENCODING_PREFIX, KEY_ENCODING_RAW, MANIFEST_DIR, FileRef, Manifest, manifest_path
from ..remote import RemoteStore, local_file_in
from ..transfer import TransferStats, download_all, upload_all
from .base import CommitResult, LoadResult, StateBackend

DEFAULT_TRANSFER_THREADS = 4
DEFAULT_L0_COMPACTION_TRIGGER = 8
# Table format the JVM's reader understands: Spark 4.1 ships rocksdbjni 9.8.4, older than the
# RocksDB inside rocksdict (10.x). Format 5 is read by every RocksDB since 6.6.
TABLE_FORMAT_VERSION = 5
BLOOM_BITS_PER_KEY = 10  # point lookups in the JVM skip files that cannot hold the key
METADATA_BLOCK_BYTES = 4096  # index and filter partitions
APPLY_CHUNK_ROWS = 16384
# The worker serves no reads (the JVM reads views), so its cache only holds what compactions and
# restores touch: small, shared by every store in the worker.
WORKER_BLOCK_CACHE_BYTES = 8 << 20
STALE_COPY_SCAN_INTERVAL_S = 3600.0
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


def _ms(started: float) -> int:
    return int((time.perf_counter() - started) * 1000)


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


class RocksDBBackend(StateBackend):
    name = "rocksdb"
    read_path = "view"
    key_encodings = (KEY_ENCODING_RAW, KEY_ENCODING_PREFIX)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        base = Path(self.ctx.local_dir or tempfile.gettempdir()) / "rocksdb"
        base.mkdir(parents=True, exist_ok=True)
        self.work_dir = Path(tempfile.mkdtemp(prefix=f"op{self.ctx.operator_id}-p{self.ctx.partition_id}-", dir=base))
        self.threads = int(self.ctx.options.get("transferThreads", DEFAULT_TRANSFER_THREADS))
        self.l0_trigger = int(self.ctx.options.get("rocksdb.l0CompactionTrigger", DEFAULT_L0_COMPACTION_TRIGGER))
        opts = self.ctx.options
        self.local_copies: LocalRecoveryStore | None = None
        if opts.get("localRecovery", "true").lower() == "true":
            self.local_copies = LocalRecoveryStore(
                Path(opts.get("localRecoveryDir") or default_root(self.ctx.host_dir)),
                self.ctx.store_dir,
                int(opts.get("localRecoveryVersions", DEFAULT_VERSIONS_KEPT)),
                hook=self._fault_point,
            )
        self._db: rocksdict.Rdict | None = None
        self._db_dir: Path | None = None
        self._db_version: int | None = None  # the committed version the local DB holds exactly
        self._db_manifest_id: str | None = None  # None for version 0 (no manifest)
        self._db_num_keys = 0

    # -- local DB --------------------------------------------------------------------------
    def _options(self, *, create: bool) -> rocksdict.Options:
        opts = rocksdict.Options(raw_mode=True)
        opts.create_if_missing(create)
        opts.set_level_zero_file_num_compaction_trigger(self.l0_trigger)
        opts.set_level_zero_slowdown_writes_trigger(max(20, self.l0_trigger * 3))
        opts.set_level_zero_stop_writes_trigger(max(36, self.l0_trigger * 5))
        opts.set_compression_type(rocksdict.DBCompressionType.lz4())
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
        from a manifest must exist, and must hold keys when the manifest says it does."""
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
        write_opts.disable_wal = True  # every commit flushes; uncommitted writes need no log
        db.set_write_options(write_opts)
        self._db, self._db_dir = db, db_dir
        self._db_version = version
        self._db_manifest_id = manifest.manifest_id if manifest else None
        self._db_num_keys = manifest.num_keys if manifest else 0

    def _drop_db(self) -> None:
        if self._db is not None:
            self._db.close()
        if self._db_dir is not None:
            shutil.rmtree(self._db_dir, ignore_errors=True)
        self._db = self._db_dir = self._db_version = self._db_manifest_id = None

    def _fresh_dir(self, label: str) -> Path:
        d = self.work_dir / f"{label}-{uuid.uuid4().hex[:8]}"
        d.mkdir()
        return d

    def _ensure_at(self, version: int) -> tuple[Manifest | None, dict[str, int]]:
        """Makes the local DB hold exactly `version`; returns its manifest and what it cost."""
        if version == 0:
            if self._db_version != 0:
                self._open(self._fresh_dir("db-0"), 0, None)
            return None, {}
        manifest = self.read_manifest(version)
        if self._db_version == version and self._db_manifest_id == manifest.manifest_id:
            return manifest, {}
        started = time.perf_counter()
        db_dir = self._fresh_dir(f"db-{version}")
        try:
            local_files, local_bytes, stats = self._restore_files(manifest, db_dir)
            self._open(db_dir, version, manifest)
        except BaseException:
            shutil.rmtree(db_dir, ignore_errors=True)  # a failed restore leaves nothing behind
            raise
        return manifest, {
            "restoreLocalFiles": local_files,
            "restoreLocalBytes": local_bytes,
            "restoreRemoteFiles": stats.files,
            "restoreRemoteBytes": stats.bytes,
            "restoreMs": _ms(started),
        }

    def _restore_files(self, manifest: Manifest, db_dir: Path) -> tuple[int, int, TransferStats]:
        """Puts every file of `manifest` into `db_dir`: from local copies when they match, else
        downloaded. Every logical name is checked to be a plain file name before it is used."""
        version = manifest.version
        local_files, local_bytes = 0, 0
        missing: list[tuple[FileRef, str]] = []
        if self.local_copies is not None:
            self.local_copies.drop_superseded(version, manifest.manifest_id)
        for name, ref in {**manifest.shared, **manifest.private}.items():
            target = Path(local_file_in(db_dir, name, store=self.ctx.store_dir, version=version))
            found = (
                self.local_copies.find(name, ref, version=version, manifest_id=manifest.manifest_id)
                if self.local_copies
                else None
            )
            if found is None:
                missing.append((ref, name))
                continue
            _link_or_copy(found, target, link=name.endswith(".sst"))
            local_files, local_bytes = local_files + 1, local_bytes + ref.size
            self._fault_point("restore:file")
        stats = download_all(self.remote, missing, db_dir, self.threads, version=version, hook=self._fault_point)
        return local_files, local_bytes, stats

    # -- reading ---------------------------------------------------------------------------
    def load(self, version: int, view_dir: str | None = None) -> LoadResult:
        """Makes the local DB hold `version` and leaves it as a read view at `view_dir` (a RocksDB
        checkpoint: hard links). Nothing proportional to the number of keys is read or sent.
        Without `view_dir` (Python callers) only the local DB is brought to `version`."""
        target = self._view_target(view_dir, version) if view_dir is not None else None
        _, cost = self._ensure_at(version)
        assert self._db is not None
        if target is not None:
            t = time.perf_counter()
            rocksdict.Checkpoint(self._db).create_checkpoint(str(target))
            cost = {**cost, "viewMs": _ms(t)}
        if "restoreMs" not in cost:
            source = "memory"
        elif cost["restoreRemoteFiles"] == 0:
            source = "local-copy"
        else:
            source = "remote" if cost["restoreLocalFiles"] == 0 else "local-copy+remote"
        return LoadResult(
            None,
            self._db_num_keys,
            cost.get("restoreRemoteBytes", 0),
            source,
            cost,
            manifest_id=self._db_manifest_id or "",
        )

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
        base, load_cost = self._ensure_at(base_version)
        self.check_base(base_version, base.manifest_id if base else "", base_manifest_id)
        db = self._db
        assert db is not None
        # From here on the local DB no longer equals any manifest until this commit succeeds.
        self._db_version = self._db_manifest_id = None
        metrics: dict[str, int] = {**load_cost}

        t = time.perf_counter()
        change_file = self._write_change_file(changes, version)
        metrics["applyMs"] = _ms(t)
        self._fault_point("commit:applied")

        t = time.perf_counter()
        if change_file is not None:
            ingest = rocksdict.IngestExternalFileOptions()
            ingest.set_move_files(True)
            db.ingest_external_file([str(change_file)], ingest)
        metrics["flushMs"] = _ms(t)
        self._fault_point("commit:flushed")

        published = False
        try:
            t = time.perf_counter()
            rocksdict.Checkpoint(db).create_checkpoint(str(checkpoint_dir))
            metrics["checkpointMs"] = _ms(t)
            self._fault_point("commit:checkpointed")
            with self.commit_attempt(version) as lease:
                t = time.perf_counter()
                shared, private, to_upload = self._plan_files(checkpoint_dir, base, version, lease.token)
                try:
                    uploaded = upload_all(
                        self.remote,
                        [(checkpoint_dir / name, rel) for name, rel in to_upload],
                        self.threads,
                        hook=self._fault_point,
                    )
                except OSError:
                    lease.check_before_publish()  # a stalled attempt's files may be gone: say so
                    raise
                for (name, _), ref in zip(to_upload, uploaded, strict=True):
                    (shared if ref.path.startswith("shared/") else private)[name] = ref
                metrics["uploadMs"] = _ms(t)
                self._fault_point("commit:uploaded")

                t = time.perf_counter()
                manifest = self.new_manifest(version, num_keys, attempt_id, shared=shared, private=private)
                body = manifest.to_json()
                lease.check_before_publish()
                self.remote.publish(manifest_path(version), body)  # the commit point
                published = True
                metrics["manifestMs"] = _ms(t)
            self._fault_point("commit:manifest-written")
            if self.local_copies is not None:
                saved = self.local_copies.save(version, manifest.manifest_id, checkpoint_dir)
                metrics["localCopySaved"] = int(saved.kept)
                metrics["localCopyBytesCopied"] = saved.bytes_copied
        finally:
            if view_dir is None or not published:
                shutil.rmtree(checkpoint_dir, ignore_errors=True)  # a view only for a published version
        self._db_version, self._db_manifest_id, self._db_num_keys = version, manifest.manifest_id, num_keys
        bytes_uploaded = sum(r.size for r in uploaded)
        metrics.update(
            filesUploaded=len(uploaded),
            filesReused=len(shared) + len(private) - len(uploaded),
            bytesUploaded=bytes_uploaded,
        )
        return CommitResult(
            version,
            num_keys,
            bytes_uploaded + len(body),
            len(uploaded) + 1,
            manifest_path(version),
            metrics,
            manifest_id=manifest.manifest_id,
        )

    def _write_change_file(self, changes: frames.Changes, version: int) -> Path | None:
        """Writes the version's changes as one SST file (puts, and deletes as tombstones), to be
        ingested into the local DB: no memtable to fill and no flush, so a large commit costs the
        worker a data block of memory, not the whole batch. The JVM sends frames sorted by key (a
        table from a Python caller is sorted here); the frame is read in slices, so the Python
        objects of a large commit never all exist at once. None when there are no changes."""
        path = self.work_dir / f"changes-{version}-{uuid.uuid4().hex[:8]}.sst"
        writer: rocksdict.SstFileWriter | None = None
        try:
            for chunk in frames.change_batches(frames.sorted_by_key(changes), APPLY_CHUNK_ROWS):
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
            if isinstance(e, StoreConfigError):
                raise
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

    def _plan_files(
        self, checkpoint_dir: Path, base: Manifest | None, version: int, token: str
    ) -> tuple[dict[str, FileRef], dict[str, FileRef], list[tuple[str, str]]]:
        """Splits the checkpoint into reused SSTs (placeholders) and files to upload. New files carry
        the attempt's token in their path (see leases.py)."""
        shared: dict[str, FileRef] = {}
        private: dict[str, FileRef] = {}
        to_upload: list[tuple[str, str]] = []
        private_dir = f"private/{version}-{token}"
        for name in sorted(os.listdir(checkpoint_dir)):
            size = (checkpoint_dir / name).stat().st_size
            if name.endswith(".sst"):
                previous = base.shared.get(name) if base else None
                if previous is not None and previous.size == size:
                    shared[name] = previous  # uploaded by an earlier version, listed by the confirmed base
                else:
                    to_upload.append((name, f"shared/{token}-{name}"))
            else:
                to_upload.append((name, f"{private_dir}/{name}"))
        return shared, private, to_upload

    def maintenance(self, now: float | None = None) -> dict[str, Any]:
        report = super().maintenance(now)
        if self.local_copies is not None:
            report["staleLocalStoresRemoved"] = _scan_stale_copies(self.local_copies.dir.parent.parent)
        return report

    def close(self) -> None:
        self._drop_db()
        shutil.rmtree(self.work_dir, ignore_errors=True)


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
