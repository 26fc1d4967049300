"""The `rocksdb` backend: Flink's incremental RocksDB checkpoints (DESIGN §3, §4), via rocksdict.

Each commit applies the version's changes to a local RocksDB, flushes, takes a native checkpoint
(hard links) and uploads only the SST files that the confirmed base version's manifest does not
already list; the non-SST files (MANIFEST, OPTIONS, CURRENT, ...) are uploaded every time, as
private files. The version's manifest is written last, atomically: it is the commit point.

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

import pyarrow as pa
import rocksdict

from .. import frames
from ..errors import CheckpointDamagedError
from ..local_recovery import DEFAULT_VERSIONS_KEPT, LocalRecoveryStore, clean_stale_stores, default_root
from ..manifest import MANIFEST_DIR, FileRef, Manifest, manifest_path
from ..remote import RemoteStore, local_file_in
from ..transfer import TransferStats, download_all, upload_all
from .base import CommitResult, LoadResult, StateBackend

DEFAULT_TRANSFER_THREADS = 4
DEFAULT_L0_COMPACTION_TRIGGER = 8
STALE_COPY_SCAN_INTERVAL_S = 3600.0
_shared_cache_lock = threading.Lock()
_shared_cache: rocksdict.Cache | None = None
_last_stale_scan: dict[Path, float] = {}


def _block_cache() -> rocksdict.Cache:
    """One block cache for every store in the worker, so memory does not grow with partitions."""
    global _shared_cache
    with _shared_cache_lock:
        if _shared_cache is None:
            _shared_cache = rocksdict.Cache(64 << 20)
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
                Path(opts.get("localRecoveryDir") or default_root()),
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
        table = rocksdict.BlockBasedOptions()
        table.set_block_cache(_block_cache())
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
    def load(self, version: int) -> LoadResult:
        _, cost = self._ensure_at(version)
        assert self._db is not None
        sink = pa.BufferOutputStream()
        keys: list[bytes] = []
        values: list[bytes] = []
        with pa.ipc.new_stream(sink, frames.STATE_SCHEMA) as writer:
            for k, v in self._db.items():
                keys.append(k)
                values.append(v)
                if len(keys) == 65536:
                    writer.write_batch(frames.state_batch(keys, values))
                    keys, values = [], []
            writer.write_batch(frames.state_batch(keys, values))
        if not cost:
            source = "memory"
        elif cost["restoreRemoteFiles"] == 0:
            source = "local-copy"
        else:
            source = "remote" if cost["restoreLocalFiles"] == 0 else "local-copy+remote"
        return LoadResult(
            sink.getvalue(),
            self._db_num_keys,
            cost.get("restoreRemoteBytes", 0),
            source,
            cost,
            manifest_id=self._db_manifest_id or "",
        )

    # -- writing ---------------------------------------------------------------------------
    def commit(
        self, base_version: int, changes: pa.Table, attempt_id: str, base_manifest_id: str | None = None
    ) -> CommitResult:
        version = base_version + 1
        base, load_cost = self._ensure_at(base_version)
        self.check_base(base_version, base.manifest_id if base else "", base_manifest_id)
        db = self._db
        assert db is not None
        # From here on the local DB no longer equals any manifest until this commit succeeds.
        self._db_version = self._db_manifest_id = None
        metrics: dict[str, int] = {**load_cost}

        t = time.perf_counter()
        num_keys = self._db_num_keys
        batch = rocksdict.WriteBatch(raw_mode=True)
        ops = changes.column("op").to_pylist()
        keys = changes.column("key").to_pylist()
        values = changes.column("value").to_pylist()
        for op, key, value in zip(ops, keys, values, strict=True):
            existed = db.get(key) is not None
            if op == frames.OP_PUT:
                batch.put(key, value)
                num_keys += 0 if existed else 1
            else:
                batch.delete(key)
                num_keys -= 1 if existed else 0
        db.write(batch)
        metrics["applyMs"] = _ms(t)
        self._fault_point("commit:applied")

        t = time.perf_counter()
        db.flush()
        metrics["flushMs"] = _ms(t)
        self._fault_point("commit:flushed")

        t = time.perf_counter()
        checkpoint_dir = self.work_dir / f"ckpt-{version}-{uuid.uuid4().hex[:8]}"
        rocksdict.Checkpoint(db).create_checkpoint(str(checkpoint_dir))
        metrics["checkpointMs"] = _ms(t)
        self._fault_point("commit:checkpointed")
        try:
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
                metrics["manifestMs"] = _ms(t)
            self._fault_point("commit:manifest-written")
            kept = self.local_copies is not None and self.local_copies.save(
                version, manifest.manifest_id, checkpoint_dir
            )
            metrics["localCopySaved"] = int(kept)
        finally:
            shutil.rmtree(checkpoint_dir, ignore_errors=True)  # already moved when a local copy was kept
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
