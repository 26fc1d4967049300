"""Snapshots: the manifest of a RocksDB checkpoint (a snapshot commit, or maintenance materializing a
changelog version: Flink's RocksIncrementalSnapshotStrategy), a small store's compact snapshot (its
whole state as one segment), and when one is due."""

from __future__ import annotations

import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import rocksdict

from ... import changelog, frames
from ...errors import CheckpointDamagedError, CheckpointMissingError
from ...manifest import (
    KIND_SNAPSHOT,
    MANIFEST_DIR,
    ChangesRef,
    FileRef,
    Manifest,
    snapshot_path,
    version_of_manifest,
)
from ...transfer import upload_all, upload_file
from ..context import elapsed_ms
from .config import APPLY_CHUNK_ROWS, COMPACT_SNAPSHOT_INLINE_BYTES, REPLAY_WORTH_A_SNAPSHOT_BYTES

if TYPE_CHECKING:
    from .phase_backend import PhaseBackend

log = logging.getLogger("pystatestore.rocksdb")


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


def reusable_for(b: PhaseBackend, base: Manifest | None) -> Manifest | None:
    """The snapshot whose files a new snapshot on `base` may reuse: the local DB's ancestor, if it
    is the snapshot `base`'s chain starts from (garbage collection keeps that one)."""
    ancestor = b.db.ancestor
    if base is None or ancestor is None:
        return None
    for m in b.chain_back(base):
        if not m.is_changelog:
            resolved = m
        else:
            resolved = b.read_snapshot(m.version, m.manifest_id)
            if resolved is None:
                continue
        same = resolved.version == ancestor.version and resolved.manifest_id == ancestor.manifest_id
        return ancestor if same else None
    return None


def snapshot_of_checkpoint(
    b: PhaseBackend,
    checkpoint_dir: Path,
    version: int,
    num_keys: int,
    attempt_id: str,
    token: str,
    reuse_from: Manifest | None,
    like: Manifest | None = None,
) -> tuple[Manifest, list[FileRef]]:
    """A snapshot manifest of the checkpoint: SSTs and other files `reuse_from` holds with the same
    size (SSTs, by name) or content (others, e.g. OPTIONS) are reused; other small files are stored
    inside the manifest; the rest is uploaded under this attempt's token. `like` gives the identity
    (manifest id, attempt) of the changelog version being materialized."""
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
        elif size <= b.config.inline_bytes:
            private[name] = FileRef.inline_of(path.read_bytes())
        else:
            to_upload.append((name, f"{private_dir}/{name}"))
    if reuse_from is not None and reuse_from.version != version - 1:
        # An older snapshot than the base: garbage collection keeps it only a grace period after a
        # newer one appears, so make sure its files are still there before relying on them.
        gone = sorted(r.path for n, r in shared.items() if n in reusable and not b.remote.exists(r.path))
        if gone:
            log.warning(
                "store %s: files of snapshot %d are gone (%s); version %d uploads its own",
                b.ctx.store_dir,
                reuse_from.version,
                ", ".join(gone[:3]),
                version,
            )
            b.db.ancestor = None
            return snapshot_of_checkpoint(b, checkpoint_dir, version, num_keys, attempt_id, token, None, like)
    uploaded = upload_all(
        b.remote, [(checkpoint_dir / name, rel) for name, rel in to_upload], b.config.threads, hook=b.fault_point
    )
    for (name, _), ref in zip(to_upload, uploaded, strict=True):
        (shared if ref.path.startswith("shared/") else private)[name] = ref
    manifest = b.new_manifest(version, num_keys, attempt_id, shared=shared, private=private)
    if like is not None:
        manifest = replace(
            manifest,
            manifest_id=like.manifest_id,
            checkpoint_id=like.checkpoint_id,
            attempt_id=like.attempt_id,
            kind=KIND_SNAPSHOT,
            num_internal_keys=like.num_internal_keys,
        )
    return manifest, uploaded


def compact_snapshot_of(
    b: PhaseBackend, checkpoint_dir: Path, m: Manifest, token: str
) -> tuple[Manifest, list[FileRef]]:
    """A snapshot of a small store as one segment of its whole state (every pair, as puts), stored
    inline or under changelog/: a few bytes a row, where a RocksDB checkpoint costs its SSTs' index
    and filter blocks and an OPTIONS file besides."""
    opts = rocksdict.Options(raw_mode=True)
    opts.create_if_missing(False)
    db = rocksdict.Rdict(str(checkpoint_dir), opts, access_type=rocksdict.AccessType.read_only())
    try:
        changes, uploaded = store_state(b, _state_batches(db), m.version, token)
    finally:
        db.close()
    snapshot = replace(
        b.new_manifest(m.version, m.num_keys, m.attempt_id),
        manifest_id=m.manifest_id,
        checkpoint_id=m.checkpoint_id,
        kind=KIND_SNAPSHOT,
        changes=changes,
        num_internal_keys=m.num_internal_keys,
    )
    return snapshot, uploaded


def store_state(
    b: PhaseBackend, batches: Iterable[pa.RecordBatch], version: int, token: str
) -> tuple[ChangesRef, list[FileRef]]:
    """A whole state (its pairs as puts, in key order) as one segment of a compact snapshot: inside
    the manifest up to COMPACT_SNAPSHOT_INLINE_BYTES, else under changelog/."""
    segment = b.db.work_dir / f"state-{version}-{uuid.uuid4().hex[:8]}"
    try:
        rows = changelog.write_segment(segment, batches)
        inline_limit = min(b.config.inline_bytes, COMPACT_SNAPSHOT_INLINE_BYTES)
        return store_changes(b, segment, rows, version, token, inline_limit)
    finally:
        segment.unlink(missing_ok=True)


def store_changes(
    b: PhaseBackend, segment: Path, rows: int, version: int, token: str, inline_limit: int
) -> tuple[ChangesRef, list[FileRef]]:
    """A segment (a version's changes, or a compact snapshot's state) inside the manifest when at most
    `inline_limit` bytes, else uploaded under changelog/."""
    size = segment.stat().st_size
    if size <= inline_limit:
        return ChangesRef(rows, FileRef.inline_of(segment.read_bytes())), []
    ref = upload_file(b.remote, segment, f"changelog/{version}-{token}.changes", hook=b.fault_point)
    b.fault_point("upload:file")
    return ChangesRef(rows, ref), [ref]


def prepare_materialization(b: PhaseBackend, force: bool = False) -> Materialization | None:
    """Under the store's lock: if the newest version is a changelog version the local DB holds and
    the chain since the last snapshot is due one (`snapshot_due_for`), or it has no snapshot
    and `force` asks for one, a checkpoint of it (hard links) to make its snapshot from. Nothing is
    uploaded here. A chain that cannot be walked (an ancestor was replaced after the version was
    committed on it) gets no snapshot: Spark commits such a version again before it reads it, so
    periodic maintenance skips it and goes on collecting garbage; a `force`d snapshot says why it
    cannot be made."""
    db = b.db
    if b.config.mode != "changelog" or db.db is None or not db.version or db.dir is None:
        return None
    held = (db.version, db.manifest_id)
    if not force and db.no_snapshot_due == held:
        return None  # committed versions never change: their chain is as long as when last looked at
    newest = max((v for f in b.remote.list_files(MANIFEST_DIR) if (v := version_of_manifest(f.path))), default=0)
    if newest != db.version:
        return None
    # The attempt the local DB holds: under checkpoint ids the newest version may have several.
    m = b.read_manifest(newest, b.attempt_for_lookup(db.manifest_id))
    if not m.is_changelog or not db.holds(m):
        return None
    deltas, changes = 0, {}
    try:
        snapshot_bytes = 0  # the chain reaches back to version 1: replays start from nothing
        for c in b.chain_back(m):
            if not c.is_changelog:
                snapshot_bytes = c.stored_bytes
                break
            if b.remote.exists(snapshot_path(c.version, c.manifest_id)):
                made = b.read_snapshot(c.version, c.manifest_id)
                snapshot_bytes = made.stored_bytes if made is not None else 0
                break
            deltas += 1
            changes[c.version] = c.changes.ref.size if c.changes else 0
        db.snapshot_taken(m.version - deltas, snapshot_bytes)
        db.changes_bytes.update(changes)
        due = snapshot_due_for(b, deltas, sum(changes.values()), snapshot_bytes)
        if not (due or (force and deltas > 0)):
            db.no_snapshot_due = held
            return None
        reuse_from = reusable_for(b, m)
    except (CheckpointDamagedError, CheckpointMissingError) as e:
        if force:
            raise
        log.warning(
            "store %s: no snapshot of version %d: %s (file %s); loading it fails the same way until Spark "
            "commits it again",
            b.ctx.store_dir,
            m.version,
            e.problem,
            e.file,
        )
        return None
    checkpoint_dir = db.work_dir / f"materialize-{m.version}-{uuid.uuid4().hex[:8]}"
    db.checkpoint(checkpoint_dir)
    return Materialization(m, checkpoint_dir, reuse_from, db.dir)


def finish_materialization(b: PhaseBackend, job: Materialization) -> None:
    """Without the store's lock: uploads the snapshot and publishes snapshots/<v>-<id>.json."""
    t = time.perf_counter()
    try:
        m = job.manifest
        sst_bytes = sum(p.stat().st_size for p in job.checkpoint_dir.glob("*.sst"))
        with b.commit_attempt(m.version) as lease:
            if sst_bytes <= b.config.compact_snapshot_bytes:
                snapshot, uploaded = compact_snapshot_of(b, job.checkpoint_dir, m, lease.token)
            else:
                snapshot, uploaded = snapshot_of_checkpoint(
                    b, job.checkpoint_dir, m.version, m.num_keys, m.attempt_id, lease.token, job.reuse_from, like=m
                )
            b.fault_point("materialize:uploaded")
            lease.check_before_publish()
            b.remote.publish(snapshot_path(m.version, m.manifest_id), snapshot.to_json())
        b.fault_point("materialize:published")
        job.snapshot = snapshot
        job.metrics = {
            "materializedVersion": m.version,
            "materializeFilesUploaded": len(uploaded),
            "materializeBytesUploaded": sum(r.size for r in uploaded),
            "materializeChangesDeletedBytes": truncate_changes(b, m),
            "materializeMs": elapsed_ms(t),
        }
    finally:
        shutil.rmtree(job.checkpoint_dir, ignore_errors=True)


def truncate_changes(b: PhaseBackend, m: Manifest) -> int:
    """Deletes changelog version `m`'s changes file now that its snapshot is published (durably:
    `publish` syncs it first), unless the store keeps them for the change feed (decision 0043,
    Flink's changelog truncation after materialization). Returns the bytes freed. A restore that
    planned to replay it before the snapshot appeared plans again (restore.ensure_at); a crash
    before the delete leaves a file garbage collection removes."""
    if b.config.keep_snapshotted_changes or m.changes is None or m.changes.ref.inline:
        return 0
    b.remote.delete(m.changes.ref.path)
    b.fault_point("materialize:truncated")
    return m.changes.ref.size


def complete_materialization(b: PhaseBackend, job: Materialization) -> None:
    """Under the store's lock again: the new snapshot becomes the local DB's ancestor if the DB is
    the one it was made from (its files are still there under the same names)."""
    if job.snapshot is not None and b.db.dir == job.db_dir:
        b.db.ancestor = job.snapshot
        b.db.snapshot_taken(job.snapshot.version, job.snapshot.stored_bytes)


def snapshot_due(b: PhaseBackend) -> bool:
    """Whether the local DB's version (just committed) is due a snapshot (`snapshot_due_for`), or
    ends a chain not known here (after a restore from a changelog version's local copy): then
    maintenance should look now."""
    return snapshot_due_at(b, b.db.version)


def snapshot_due_at(b: PhaseBackend, version: int | None) -> bool:
    """`snapshot_due` of `version`, committed on the local DB's chain (a durable-first commit is
    due before its apply has brought the local DB to it)."""
    db = b.db
    if b.config.mode != "changelog" or not version:
        return False
    if db.snapshot_at is None:
        return True
    return snapshot_due_for(b, version - db.snapshot_at, db.changes_since_snapshot(version), db.snapshot_bytes)


def snapshot_due_for(b: PhaseBackend, deltas: int, changes_bytes: int, snapshot_bytes: int) -> bool:
    """Whether a chain of `deltas` changelog versions, their changes `changes_bytes` stored, after a
    snapshot of `snapshot_bytes` (0: none, the chain starts at version 1) is due a new snapshot:
    minDeltasForSnapshot versions, changelogMaxBytes of changes, or changes a restore would take
    longer to replay than to read a snapshot of the whole state (decision 0041): a fraction
    (snapshotChangesFraction) of the snapshot, once they are worth a replay at all."""
    if deltas <= 0:
        return False
    if deltas >= b.ctx.min_deltas_for_snapshot or changes_bytes >= b.config.changelog_max_bytes:
        return True
    fraction = b.config.snapshot_changes_fraction
    return fraction > 0 and changes_bytes >= max(REPLAY_WORTH_A_SNAPSHOT_BYTES, fraction * snapshot_bytes)


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
