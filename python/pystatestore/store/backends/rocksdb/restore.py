"""Restoring: bringing the local DB to a committed version (Flink's RocksDBIncrementalRestoreOperation).

The state starts from the first of these found walking back from the version along its chain: the
local DB itself, a verified local copy, a snapshot (the version's own manifest, or one maintenance
made; files from local copies when they match, else downloaded), or version 0. The changes of the
versions after it are then replayed (replay.py).
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ...errors import CheckpointDamagedError, CheckpointMissingError
from ...manifest import FileRef, Manifest, snapshot_path
from ...remote import local_file_in
from ...transfer import TransferStats, download_all
from ..context import elapsed_ms
from .local_db import take_local_file
from .replay import apply_segment, changes_on_host, changes_truncated, replay_chain
from .restore_stats import RestoreStats

if TYPE_CHECKING:
    from .phase_backend import PhaseBackend

log = logging.getLogger("pystatestore.rocksdb")


def ensure_at(
    b: PhaseBackend, version: int, checkpoint_id: str | None = None
) -> tuple[Manifest | None, dict[str, int]]:
    """Makes the local DB hold exactly `version`; returns its manifest and what it cost. A snapshot
    that is only in the checkpoint is passed over for an older local copy when every version in
    between has its changes on this host (or inside its manifest): a restart on the same host then
    reads nothing from the checkpoint but manifests (Flink's local recovery). A changes file deleted
    under the restore because a snapshot of its version appeared meanwhile (decision 0043) makes
    it plan once more, from that snapshot; a failed replay has already dropped the local DB."""
    try:
        return _restore(b, version, checkpoint_id)
    except CheckpointMissingError as e:
        if not changes_truncated(b, e):
            raise
        log.info(
            "store %s: %s was folded into a snapshot while version %d was restored; restoring again",
            b.ctx.store_dir,
            e.file,
            version,
        )
        return _restore(b, version, checkpoint_id)


def _restore(b: PhaseBackend, version: int, checkpoint_id: str | None) -> tuple[Manifest | None, dict[str, int]]:
    db = b.db
    if version == 0:
        if db.version != 0:
            db.open_empty()
        return None, {}
    target = b.read_manifest(version, checkpoint_id)
    if db.holds(target):
        return target, {}
    started = time.perf_counter()
    replay: list[Manifest] = []
    restore = RestoreStats()
    copies: set[tuple[int, str]] = set()  # (version, manifest id) of each local copy
    if b.local_copies is not None:
        if target.checkpoint_id is None:  # under checkpoint ids no attempt supersedes another
            b.local_copies.drop_superseded(target.version, target.manifest_id)
        copies = {(c.version, c.manifest_id) for c in b.local_copies.copies()}
    # A snapshot in the checkpoint passed over for an older local copy, and how many of the
    # versions to replay come after it (taken instead if the walk finds no usable copy).
    passed_over: tuple[Manifest, int] | None = None

    def local_path_on(m: Manifest) -> bool:
        """Replaying `m` reads nothing from the checkpoint, and an older local copy may end the walk."""
        return m.is_changelog and changes_on_host(b, m) and any(v < m.version for v, _ in copies)

    chain = b.chain_back(target)
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
        if db.holds(m):
            restore.started_from = f"the local DB at version {m.version}"
            passed_over = None
            break  # the local DB is a version this chain passes through: replay the rest
        copy = (
            b.local_copies.verified_copy(m.version, m.manifest_id)
            if b.local_copies is not None and (m.version, m.manifest_id) in copies
            else None
        )
        if copy is not None and restore_from_copy(b, m, copy, restore):
            passed_over = None
            break
        if passed_over is not None:
            if local_path_on(m):
                replay.append(m)
                continue
            break  # going further would read the checkpoint: take the snapshot passed over
        snapshot = m if not m.is_changelog else b.read_snapshot(m.version, m.manifest_id)
        if snapshot is not None:
            if local_path_on(m):
                passed_over = (snapshot, len(replay))
                replay.append(m)
                continue
            restore_snapshot(b, snapshot, restore, own_manifest=snapshot is m)
            break
        replay.append(m)
        if m.base_version == 0:
            db.open_empty()
            break
    if passed_over is not None:
        snapshot, after = passed_over
        del replay[after:]
        restore_snapshot(b, snapshot, restore, own_manifest=False)  # passed over only when made by maintenance
    replay_chain(b, list(reversed(replay)), restore)
    if replay and target.num_keys > 0 and db.is_empty():
        db.drop()
        raise CheckpointDamagedError(
            f"the manifest says the version holds {target.num_keys} keys, but replaying its changes left none",
            store=b.ctx.store_dir,
            version=target.version,
            file=target.path,
        )
    db.set_version(target.version, target)
    restore.metrics.update(restore.cost(started))
    if restore.remote.files:
        # Operators ask why a restart on the same host read the checkpoint: say which versions did.
        log.info(
            "store %s restored version %d reading %d file(s), %d bytes from the checkpoint "
            "(started from %s; replayed %d version(s); local copies of versions %s)",
            b.ctx.store_dir,
            target.version,
            restore.remote.files,
            restore.remote.bytes,
            restore.started_from,
            len(replay),
            sorted({v for v, _ in copies}) or "none",
        )
    return target, restore.metrics


def restore_snapshot(b: PhaseBackend, snapshot: Manifest, restore: RestoreStats, *, own_manifest: bool) -> None:
    """The local DB from `snapshot`: its files, or its whole state as one segment (compact).
    `own_manifest`: the snapshot is its version's manifest, not one maintenance made beside it."""
    restore.started_from = f"snapshot {snapshot.version} ({snapshot.manifest_id})"
    if snapshot.changes is not None:
        holder = snapshot.path if own_manifest else snapshot_path(snapshot.version, snapshot.manifest_id)
        restore_compact_snapshot(b, snapshot, restore, holder)
        return
    db_dir = b.db.fresh_dir(f"db-{snapshot.version}")
    try:
        t = time.perf_counter()
        local_files, local_bytes, stats = restore_files(b, snapshot, db_dir)
        restore.download_ms += elapsed_ms(t)
        t = time.perf_counter()
        b.db.open(db_dir, snapshot.version, snapshot)
        restore.open_ms += elapsed_ms(t)
    except BaseException:
        shutil.rmtree(db_dir, ignore_errors=True)  # a failed restore leaves nothing behind
        raise
    b.db.ancestor = snapshot
    b.db.snapshot_taken(snapshot.version, snapshot.stored_bytes)
    restore.local_files += local_files
    restore.local_bytes += local_bytes
    restore.downloaded(stats)


def restore_compact_snapshot(b: PhaseBackend, snapshot: Manifest, restore: RestoreStats, holder: str) -> None:
    """A snapshot that holds the whole state as one segment: an empty DB plus that segment,
    ingested as one SST. `holder` is the manifest file the snapshot was read from."""
    assert snapshot.changes is not None
    db = b.db
    db.open(db.fresh_dir(f"db-{snapshot.version}"), 0, None)
    where = snapshot.changes.ref.path or holder
    t = time.perf_counter()
    apply_segment(b, snapshot, f"the state of snapshot {snapshot.version}", where, restore)
    restore.ingest_ms += elapsed_ms(t)
    if snapshot.num_keys > 0 and db.is_empty():
        db.drop()
        raise CheckpointDamagedError(
            f"snapshot {snapshot.version} says it holds {snapshot.num_keys} keys, but its state is empty",
            store=b.ctx.store_dir,
            version=snapshot.version,
            file=holder,
        )
    db.set_version(snapshot.version, snapshot)
    db.ancestor = None  # the local DB's files descend from no uploaded snapshot
    db.snapshot_taken(snapshot.version, snapshot.stored_bytes)
    if snapshot.changes.ref.inline:
        restore.inline_snapshots += 1


def restore_from_copy(b: PhaseBackend, m: Manifest, copy: dict[str, Path], restore: RestoreStats) -> bool:
    """The local DB from the verified local copy `copy` of version `m`. False, with nothing left
    behind, when the copy was pruned part way (see `take_local_file`)."""
    db_dir = b.db.fresh_dir(f"db-{m.version}")
    files, size = 0, 0
    try:
        for name, src in copy.items():
            dst = db_dir / name
            if not take_local_file(src, dst, link=name.endswith(".sst")):
                log.warning(
                    "local recovery copy %s of store %s (version %d) was removed while it was being "
                    "restored (another instance of the store on this host pruned it); restoring from "
                    "the checkpoint instead",
                    src.parent,
                    b.ctx.store_dir,
                    m.version,
                )
                shutil.rmtree(db_dir, ignore_errors=True)
                return False
            files, size = files + 1, size + dst.stat().st_size
            b.fault_point("restore:file")
        try:
            t = time.perf_counter()
            b.db.open(db_dir, m.version, m)
            restore.open_ms += elapsed_ms(t)
        except CheckpointDamagedError as e:
            # Every file the marker lists matched, yet they do not open: the copy lost files its
            # marker never listed (pruned by another instance while it was saved). Never fatal,
            # and never again: the copy goes and the checkpoint serves this restore.
            log.warning(
                "local recovery copy of store %s version %d does not open as a database (%s); removing it "
                "and restoring from the checkpoint instead",
                b.ctx.store_dir,
                m.version,
                e,
            )
            shutil.rmtree(db_dir, ignore_errors=True)
            assert b.local_copies is not None
            b.local_copies.discard(m.version, m.manifest_id)
            return False
    except BaseException:
        shutil.rmtree(db_dir, ignore_errors=True)
        raise
    restore.local_files += files
    restore.local_bytes += size
    restore.started_from = f"the local copy of version {m.version}"
    # The copy's files carry the names of the lineage that wrote it: a snapshot of that version
    # lists them; for a changelog version nothing says which snapshot's files they are.
    b.db.ancestor = None if m.is_changelog else m
    if not m.is_changelog:  # a changelog copy: its snapshot is unknown until maintenance looks it up
        b.db.snapshot_taken(m.version, m.stored_bytes)
    return True


def is_sst(name: str) -> bool:
    return name.endswith(".sst")


def restore_files(b: PhaseBackend, manifest: Manifest, db_dir: Path) -> tuple[int, int, TransferStats]:
    """Puts every file of snapshot `manifest` into `db_dir`: stored inside the manifest, from local
    copies when they match, else downloaded. Every logical name is checked to be a plain file name
    before it is used."""
    version = manifest.version
    store = b.ctx.store_dir
    local_files, local_bytes = 0, 0
    missing: list[tuple[FileRef, str]] = []
    if b.local_copies is not None:
        b.local_copies.drop_superseded(version, manifest.manifest_id)
    for name, ref in {**manifest.shared, **manifest.private}.items():
        target = Path(local_file_in(db_dir, name, store=store, version=version))
        if ref.inline:
            target.write_bytes(ref.content(store=store, version=version, name=name))
            continue
        found = (
            b.local_copies.find(name, ref, version=version, manifest_id=manifest.manifest_id)
            if b.local_copies
            else None
        )
        if found is None or not take_local_file(found, target, link=name.endswith(".sst")):
            missing.append((ref, name))
            continue
        local_files, local_bytes = local_files + 1, local_bytes + ref.size
        b.fault_point("restore:file")
    # RocksDB never writes into an SST: those may be hard links to a checkpoint on the same disk.
    stats = download_all(b.remote, missing, db_dir, b.config.threads, version=version, hook=b.fault_point, link=is_sst)
    return local_files, local_bytes, stats
