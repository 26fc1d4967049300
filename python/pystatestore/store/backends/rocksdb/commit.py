"""Committing a version: the JVM's changes go into the local DB as one ingested SST, a RocksDB
checkpoint of it becomes the JVM's view, and what is made durable depends on the commit mode:
the version's changes (changelog) or the SSTs its nearest snapshot lacks (snapshot). The manifest
is written last, atomically: it is the commit point."""

from __future__ import annotations

import itertools
import logging
import math
import shutil
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from ... import changelog, frames
from ...errors import CheckpointMissingError, StoreConfigError
from ...leases import CommitLease
from ...manifest import SNAPSHOT_DIR, snapshot_of
from ..context import CommitResult, elapsed_ms
from .config import APPLY_CHUNK_ROWS
from .restore import ensure_at
from .snapshots import reusable_for, snapshot_of_checkpoint, store_changes, store_state

if TYPE_CHECKING:
    from ...manifest import FileRef, Manifest
    from .phase_backend import PhaseBackend

# The commit steps whose times a manifest records (`Manifest.commit_ms`; the report plots them). A
# durable-first commit records its segment, not the SST and ingest that come after its manifest.
TIMED_STEPS = ("restoreMs", "segmentMs", "applyMs", "flushMs", "checkpointMs", "uploadMs")

# A whole state written on an empty base becomes a compact snapshot (one segment, no local DB) when its
# frame is at most this many times compactSnapshotMaxBytes: a segment is zstd-compressed, so a frame
# some times larger still makes a segment of about that size.
COMPACT_COMMIT_FRAME_FACTOR = 8

# A changelog commit whose change frame is at most this large returns once its segment and manifest
# are durable and applies the frame to the local DB afterwards, holding the frame in memory until
# then (decision 0032); a larger one (a bulk load) applies it first, streaming, as before.
DURABLE_FIRST_MAX_FRAME_BYTES = 16 << 20

log = logging.getLogger("pystatestore.commit")


def commit_under(
    b: PhaseBackend,
    lease: CommitLease,
    base_version: int,
    changes: frames.Changes,
    attempt_id: str,
    base_manifest_id: str | None,
    num_keys: int,
    checkpoint_dir: Path,
    view_dir: str | None,
    *,
    empty_base: bool = False,
    num_internal_keys: int = 0,
) -> CommitResult:
    """The commit of version `base_version + 1` under the attempt's lease (see RocksDBBackend.commit)."""
    version = base_version + 1
    db = b.db
    if empty_base and view_dir is None:
        # Nothing will read this version through a view soon (a state rewrite): a small whole state
        # needs no local DB opened, ingested and checkpointed, only one segment.
        small, changes = small_whole_state(changes, COMPACT_COMMIT_FRAME_FACTOR * b.config.compact_snapshot_bytes)
        if small is not None:
            return commit_compact_snapshot(b, lease, version, small, attempt_id, num_keys, num_internal_keys)
    if empty_base:
        # Nothing of base_version is read: the version written is a snapshot of the changes alone.
        base, load_cost = ensure_at(b, 0)
    else:
        base, load_cost = ensure_at(b, base_version, b.attempt_for_lookup(base_manifest_id))
        b.check_base(base_version, base.manifest_id if base else "", base_manifest_id)
    assert db.db is not None
    db.forget_version()  # from here on the local DB equals no manifest until this commit succeeds
    metrics: dict[str, int] = {**load_cost}
    # A version on an empty base must end its own chain: changelog manifests need their base.
    changelog_mode = b.config.mode == "changelog" and not empty_base
    segment_path = db.work_dir / f"segment-{version}-{uuid.uuid4().hex[:8]}" if changelog_mode else None

    t = time.perf_counter()
    segment = changelog.SegmentWriter(segment_path) if segment_path is not None else None
    try:
        batches = frames.change_batches(frames.sorted_by_key(changes), APPLY_CHUNK_ROWS)
        change_file = db.write_change_file(batches, version, also=segment)
        rows = segment.close() if segment is not None else 0
    except BaseException:
        if segment is not None:
            segment.abort()
        if segment_path is not None:
            segment_path.unlink(missing_ok=True)
        raise
    metrics["applyMs"] = elapsed_ms(t)
    b.fault_point("commit:applied")

    t = time.perf_counter()
    if change_file is not None:
        db.ingest(change_file)
    metrics["flushMs"] = elapsed_ms(t)
    b.fault_point("commit:flushed")

    published = False
    try:
        t = time.perf_counter()
        db.checkpoint(checkpoint_dir)
        metrics["checkpointMs"] = elapsed_ms(t)
        b.fault_point("commit:checkpointed")
        t = time.perf_counter()
        if segment_path is not None:
            manifest, uploaded = changelog_manifest(b, lease, segment_path, rows, version, num_keys, attempt_id, base)
        else:
            manifest, uploaded = snapshot_of_checkpoint(
                b, checkpoint_dir, version, num_keys, attempt_id, lease.token, reusable_for(b, base)
            )
        manifest.num_internal_keys = num_internal_keys
        metrics["uploadMs"] = elapsed_ms(t)
        b.fault_point("commit:uploaded")
        body = publish(b, lease, base, manifest, metrics)
        published = True
        b.fault_point("commit:manifest-written")
        keep_local_copy(b, version, manifest, checkpoint_dir, segment_path if uploaded else None, rows, metrics)
    finally:
        if segment_path is not None:
            segment_path.unlink(missing_ok=True)
        if view_dir is None or not published:
            shutil.rmtree(checkpoint_dir, ignore_errors=True)  # a view only for a published version
    db.set_version(version, manifest)
    if not manifest.is_changelog:
        db.ancestor = manifest
        db.snapshot_taken(version, manifest.stored_bytes)
    return commit_result(manifest, len(body), uploaded, metrics)


def changelog_manifest(
    b: PhaseBackend,
    lease: CommitLease,
    segment: Path,
    rows: int,
    version: int,
    num_keys: int,
    attempt_id: str,
    base: Manifest | None,
) -> tuple[Manifest, list[FileRef]]:
    """The changelog manifest of `version` on `base` with `segment` stored (inline or uploaded)."""
    changes_ref, uploaded = store_changes(b, segment, rows, version, lease.token, b.config.inline_bytes)
    manifest = b.new_changelog_manifest(
        version, num_keys, attempt_id, parent_manifest_id=base.manifest_id if base else "", changes=changes_ref
    )
    b.db.changes_bytes[version] = changes_ref.ref.size  # what a restore would replay (snapshot_due_at)
    return manifest, uploaded


def publish(
    b: PhaseBackend, lease: CommitLease, base: Manifest | None, manifest: Manifest, metrics: dict[str, int]
) -> bytes:
    """The commit point: `manifest`, with its steps' times, published under the attempt's lease once
    a base the lease pinned is known to be still whole. Returns the body written."""
    t = time.perf_counter()
    manifest.commit_ms = {k: v for k in TIMED_STEPS if (v := metrics.get(k)) is not None}
    body = manifest.to_json()
    lease.check_before_publish()
    if lease.base_version is not None and base is not None:
        check_base_intact(b, base)
    b.remote.publish(manifest.path, body)
    metrics["manifestMs"] = elapsed_ms(t)
    return body


def keep_local_copy(
    b: PhaseBackend,
    version: int,
    manifest: Manifest,
    checkpoint_dir: Path,
    uploaded_segment: Path | None,
    rows: int,
    metrics: dict[str, int],
) -> None:
    """After `version` was published and checkpointed at `checkpoint_dir`: keeps it as a local
    recovery copy when one is due, and a segment that went to a file of its own on this host too."""
    copies = b.local_copies
    if copies is None:
        return
    copies.forget_later_versions(version)
    if local_copy_due(b, version, manifest, rows):
        known = {**manifest.shared, **manifest.private}  # sizes and checksums the copy need not read
        saved = copies.save(version, manifest.manifest_id, checkpoint_dir, known)
        metrics["localCopySaved"] = int(saved.kept)
        metrics["localCopyBytesCopied"] = saved.bytes_copied
        b.rows_since_local_copy = 0
    else:
        b.rows_since_local_copy += rows
    if uploaded_segment is not None:
        # The changes went to a file of their own (not inside the manifest): keep that file on this
        # host too, so a restore replays them from here. Copies older than the kept window of
        # copies never need the changes before them.
        window = b.config.local_copy_interval * copies.versions_kept
        kept = copies.save_changes(version, manifest.manifest_id, uploaded_segment, drop_through=version - window)
        metrics["localCopyBytesCopied"] = metrics.get("localCopyBytesCopied", 0) + kept.bytes_copied


def commit_durable_first(
    b: PhaseBackend,
    lease: CommitLease,
    base_version: int,
    frame: pa.Table,
    attempt_id: str,
    base_manifest_id: str | None,
    num_keys: int,
    checkpoint_dir: Path,
    num_internal_keys: int,
) -> CommitResult:
    """A changelog commit that returns once the version is durable: its segment and manifest are
    written and published, nothing else. Writing the changes into the local DB as an SST, ingesting
    it and leaving the view at `checkpoint_dir` are the result's `finish`, which the caller runs
    under the store's lock before the store's next call (decision 0032). `frame` is the whole change
    frame, checked here so that nothing it holds can fail the apply once the version is published."""
    version = base_version + 1
    db = b.db
    base, load_cost = ensure_at(b, base_version, b.attempt_for_lookup(base_manifest_id))
    b.check_base(base_version, base.manifest_id if base else "", base_manifest_id)
    frame = checked_frame(b, frame, version)
    b.fault_point("commit:frame-read")
    db.forget_version()  # until the apply has run, the local DB equals no manifest
    metrics: dict[str, int] = {**load_cost}
    segment_path = db.work_dir / f"segment-{version}-{uuid.uuid4().hex[:8]}"
    try:
        t = time.perf_counter()
        rows = changelog.write_segment(segment_path, frame.to_batches(APPLY_CHUNK_ROWS))
        metrics["segmentMs"] = elapsed_ms(t)
        b.fault_point("commit:applied")
        t = time.perf_counter()
        manifest, uploaded = changelog_manifest(b, lease, segment_path, rows, version, num_keys, attempt_id, base)
        manifest.num_internal_keys = num_internal_keys
        metrics["uploadMs"] = elapsed_ms(t)
        b.fault_point("commit:uploaded")
        body = publish(b, lease, base, manifest, metrics)
        b.fault_point("commit:manifest-written")
    except BaseException:
        segment_path.unlink(missing_ok=True)
        raise
    result = commit_result(manifest, len(body), uploaded, metrics)

    def finish() -> dict[str, int]:
        return apply_committed(b, manifest, frame, checkpoint_dir, segment_path if uploaded else None, rows)

    if not uploaded:
        segment_path.unlink(missing_ok=True)
    return replace(result, finish=finish)


def apply_committed(
    b: PhaseBackend,
    manifest: Manifest,
    frame: pa.Table,
    checkpoint_dir: Path,
    uploaded_segment: Path | None,
    rows: int,
) -> dict[str, int]:
    """The rest of a durable-first commit of `manifest`'s version: the changes into the local DB (one
    ingested SST), its checkpoint at `checkpoint_dir` as the JVM's view, the local copy. A failure
    leaves the local DB equal to no manifest (the next call restores it from the checkpoint) and no
    view, unless the view was made: a view, once there, is whole and is never removed here (the
    JVM opens a view directory it finds without asking). The version is durable either way."""
    version = manifest.version
    db = b.db
    metrics: dict[str, int] = {}
    viewed = False
    try:
        b.fault_point("apply:started")  # the reply is out; nothing of the apply done yet
        t = time.perf_counter()
        change_file = db.write_change_file(frame.to_batches(APPLY_CHUNK_ROWS), version)
        metrics["applyMs"] = elapsed_ms(t)
        b.fault_point("apply:written")
        t = time.perf_counter()
        if change_file is not None:
            db.ingest(change_file)
        metrics["flushMs"] = elapsed_ms(t)
        b.fault_point("apply:ingested")
        t = time.perf_counter()
        db.checkpoint(checkpoint_dir)  # RocksDB renames it into place whole: the JVM may open it from now on
        viewed = True
        metrics["checkpointMs"] = elapsed_ms(t)
        b.fault_point("apply:checkpointed")
        db.set_version(version, manifest)
    except BaseException:
        if not viewed:
            shutil.rmtree(checkpoint_dir, ignore_errors=True)
        if uploaded_segment is not None:
            uploaded_segment.unlink(missing_ok=True)
        raise
    try:
        keep_local_copy(b, version, manifest, checkpoint_dir, uploaded_segment, rows, metrics)
    except OSError as e:
        # A local copy only shortens restores; the version and its view are whole without it.
        log.warning("store %s: keeping version %d as a local copy failed: %s", b.ctx.store_dir, version, e)
    finally:
        if uploaded_segment is not None:
            uploaded_segment.unlink(missing_ok=True)
    return metrics


def checked_frame(b: PhaseBackend, frame: pa.Table, version: int) -> pa.Table:
    """`frame` if every op is a put or a delete and its keys strictly ascend (what the SST writer
    would otherwise refuse only after the version was published); else StoreConfigError."""
    ops = frame.column("op")
    if len(ops) and not pc.all(pc.is_in(ops, value_set=pa.array([frames.OP_PUT, frames.OP_DELETE], pa.int8()))).as_py():
        raise StoreConfigError("unknown op in the change frame", store=b.ctx.store_dir, version=version)
    keys = frame.column("key").combine_chunks()
    if len(keys) > 1 and not pc.all(pc.less(keys.slice(0, len(keys) - 1), keys.slice(1))).as_py():
        raise StoreConfigError(
            "the change frame is not sorted by key (or repeats a key)",
            store=b.ctx.store_dir,
            version=version,
            advice="The JVM shim and the Python package are of different pystatestore releases; install "
            "the same release for both.",
        )
    return frame


def commit_result(
    manifest: Manifest, manifest_bytes: int, uploaded: list[FileRef], metrics: dict[str, int]
) -> CommitResult:
    """What a published commit reports: `uploaded` are the files it wrote besides its manifest."""
    bytes_uploaded = sum(r.size for r in uploaded)
    written = {r.path for r in uploaded}
    stored = [r for r in manifest.files() if not r.inline]
    metrics.update(
        filesUploaded=len(uploaded),
        filesReused=sum(1 for r in stored if r.path not in written),
        filesInline=sum(1 for r in manifest.files() if r.inline),
        bytesUploaded=bytes_uploaded,
        changelogRows=manifest.changes.rows if manifest.changes else 0,
    )
    return CommitResult(
        manifest.version,
        manifest.num_keys,
        bytes_uploaded + manifest_bytes,
        len(uploaded) + 1,
        manifest.path,
        metrics,
        manifest_id=manifest.manifest_id,
        snapshot=not manifest.is_changelog,
        num_internal_keys=manifest.num_internal_keys,
    )


def small_whole_state(changes: frames.Changes, limit: int) -> tuple[pa.Table | None, frames.Changes]:
    """The frame as one table when it holds at most `limit` bytes, else None and the frame (a stream
    is read only as far as the limit and handed back whole, still streaming)."""
    if limit <= 0:
        return None, changes
    if isinstance(changes, pa.Table):
        return (changes if changes.nbytes <= limit else None), changes
    read: list[pa.RecordBatch] = []
    size = 0
    for batch in changes:
        read.append(batch)
        size += batch.nbytes
        if size > limit:
            rest = pa.RecordBatchReader.from_batches(changes.schema, itertools.chain(read, changes))
            return None, rest
    return pa.Table.from_batches(read, schema=changes.schema), changes


def commit_compact_snapshot(
    b: PhaseBackend,
    lease: CommitLease,
    version: int,
    state: pa.Table,
    attempt_id: str,
    num_keys: int,
    num_internal_keys: int,
) -> CommitResult:
    """Version `version` as a compact snapshot of `state` (a whole state on an empty base): its pairs
    in key order as one segment, inside the manifest or under changelog/. The local DB is left as it
    is and equals no version until a load restores one."""
    b.db.forget_version()
    metrics: dict[str, int] = {}
    t = time.perf_counter()
    puts = state.filter(pc.equal(state.column("op"), frames.OP_PUT)).sort_by([("key", "ascending")])
    metrics["applyMs"] = elapsed_ms(t)
    b.fault_point("commit:applied")
    t = time.perf_counter()
    changes_ref, uploaded = store_state(b, puts.to_batches(APPLY_CHUNK_ROWS), version, lease.token)
    metrics["uploadMs"] = elapsed_ms(t)
    b.fault_point("commit:uploaded")
    t = time.perf_counter()
    manifest = replace(
        b.new_manifest(version, num_keys, attempt_id), changes=changes_ref, num_internal_keys=num_internal_keys
    )
    manifest.commit_ms = {k: v for k in TIMED_STEPS if (v := metrics.get(k)) is not None}
    body = manifest.to_json()
    lease.check_before_publish()
    b.remote.publish(manifest.path, body)  # the commit point
    metrics["manifestMs"] = elapsed_ms(t)
    b.fault_point("commit:manifest-written")
    if b.local_copies is not None:
        b.local_copies.forget_later_versions(version)
    return commit_result(manifest, len(body), uploaded, metrics)


def check_base_intact(b: PhaseBackend, base: Manifest) -> None:
    """Raises CheckpointMissingError unless every file a restore of `base` reads is still there:
    garbage collection that planned before this attempt pinned its base may have removed them, and
    a version published on a removed base could never be loaded."""
    current = b.read_manifest(base.version, base.checkpoint_id)
    b.check_base(base.version, current.manifest_id, base.manifest_id)
    missing = _missing_for_restore(b, current)
    if missing is not None and missing.startswith("changelog/"):
        missing = _missing_for_restore(b, current)  # a snapshot may have replaced it meanwhile (0043)
    if missing is not None:
        raise CheckpointMissingError(
            f"version {base.version}, which this commit builds on, lost a file to garbage collection "
            "while the commit ran (it is older than the versions spark.sql.streaming.minBatchesToRetain keeps)",
            store=b.ctx.store_dir,
            version=base.version,
            file=missing,
            advice="Nothing was published for this attempt. Spark retries the task; if the retry fails the "
            "same way, the batch being re-run is older than the checkpoint retains: restart the query from "
            "its newest batch or raise spark.sql.streaming.minBatchesToRetain.",
        )


def _missing_for_restore(b: PhaseBackend, m: Manifest) -> str | None:
    """The first file a restore of `m` reads that is not there (None: all are)."""
    snapshots = {key: f for f in b.remote.list_files(SNAPSHOT_DIR) if (key := snapshot_of(f.path))}
    # At an infinite `now` every snapshot is settled: the chain back to the nearest one, what a restore reads.
    needed = b.dependencies(m, snapshots=snapshots, now=math.inf) | {m.path}
    return next((path for path in sorted(needed) if not b.remote.exists(path)), None)


# A changelog commit keeps a local copy, whatever the interval, once a restore from the last copy
# would replay this many rows: replaying 1M rows took 0.4 s a partition where a copy costs a commit
# about 2 ms (decision 0017), so big commits (a bulk load, a backlog) each keep one.
LOCAL_COPY_AFTER_ROWS = 100_000


def local_copy_due(b: PhaseBackend, version: int, manifest: Manifest, rows: int) -> bool:
    """Snapshot commits keep a copy of every version (an older copy cannot be brought forward);
    changelog commits every `localRecoveryInterval` versions, when the restore from it replays the
    versions in between, or sooner when those versions' `rows` (this commit's included) would make
    that replay long."""
    if not manifest.is_changelog:
        return True
    if b.rows_since_local_copy + rows >= LOCAL_COPY_AFTER_ROWS:
        return True
    return (version + b.ctx.partition_id) % b.config.local_copy_interval == 0


def missing_key_count(b: PhaseBackend, version: int) -> StoreConfigError:
    return StoreConfigError(
        "a rocksdb commit needs the new version's key count from the JVM",
        store=b.ctx.store_dir,
        version=version,
        advice="The JVM shim and the Python package are of different pystatestore releases; install the "
        "same release for both.",
    )
