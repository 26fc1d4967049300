"""Replaying changelog versions onto the local DB, and reading the segments that hold changes
(a changelog version's changes, or a compact snapshot's whole state): from inside a manifest, from
the changes kept on this host, or downloaded from the checkpoint."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from ... import changelog, frames
from ...errors import CheckpointDamagedError, CheckpointMissingError
from ...manifest import SNAPSHOT_DIR, Manifest, snapshot_of
from ...transfer import TransferStats, download_all
from ..context import elapsed_ms
from .config import APPLY_CHUNK_ROWS
from .restore_stats import RestoreStats

if TYPE_CHECKING:
    from .phase_backend import PhaseBackend

# Replay merges consecutive versions' changes into one SST while their segments add up to this:
# merging holds the versions whole, about 12 bytes of memory per byte of segment.
REPLAY_MERGE_BYTES = 256 << 10
# Replayed versions' SSTs go into the local DB in ingests of at most this many files.
REPLAY_INGEST_FILES = 8


class SegmentDownloads:
    """The segments of a replay that only the checkpoint holds, downloaded in parallel (up to
    transferThreads at a time) as soon as the replay starts, each replayed as soon as it is here
    rather than after the last byte of the chain. Each lands in a file of its own under the store's
    work directory, is read once and removed."""

    def __init__(self, b: PhaseBackend, chain: list[Manifest], restore: RestoreStats) -> None:
        self.b, self.restore = b, restore
        self.pending: dict[tuple[int, str], Future[tuple[Path, TransferStats]]] = {}
        wanted = [m for m in chain if m.changes is not None and not changes_on_host(b, m)]
        self.dir = b.db.fresh_dir("segments") if wanted else None
        self.pool = ThreadPoolExecutor(max_workers=max(1, min(b.config.threads, len(wanted)))) if wanted else None
        for m in wanted:
            assert self.pool is not None and self.dir is not None and m.changes is not None
            self.pending[(m.version, m.manifest_id)] = self.pool.submit(self._download, m, self.dir)

    def _download(self, m: Manifest, directory: Path) -> tuple[Path, TransferStats]:
        """On a pool thread; `take` counts it on the restore's own thread, so counts never race."""
        assert m.changes is not None
        name = f"segment-{m.version}-{m.manifest_id}"
        stats = download_all(
            self.b.remote, [(m.changes.ref, name)], directory, 1, version=m.version, hook=self.b.fault_point
        )
        return directory / name, stats

    def take(self, m: Manifest) -> bytes | None:
        """`m`'s segment once downloaded (the time waited counts as download time); None if it
        was not among those fetched here."""
        future = self.pending.pop((m.version, m.manifest_id), None)
        if future is None:
            return None
        started = time.perf_counter()
        path, stats = future.result()
        self.restore.download_ms += elapsed_ms(started)
        self.restore.downloaded(stats)
        try:
            return path.read_bytes()
        finally:
            path.unlink(missing_ok=True)

    def close(self) -> None:
        for future in self.pending.values():
            future.cancel()
        if self.pool is not None:
            self.pool.shutdown(wait=True)
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)


def replay_chain(b: PhaseBackend, chain: list[Manifest], restore: RestoreStats) -> None:
    """Applies the changes of `chain` (oldest first) to the local DB, which holds the version before
    the first. An ingest costs its fsyncs whatever its size, and a restart restores every partition,
    so replayed versions are ingested together: up to REPLAY_INGEST_FILES SSTs in one call (where
    files overlap, a later one's entries win). Each SST holds one version's changes, streamed chunk
    by chunk from its segment, or the merged changes of consecutive small versions (segments adding
    up to at most REPLAY_MERGE_BYTES; newest change per key), since merging holds them whole. On
    failure the local DB is dropped: it matches no version."""
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
    started, waited = time.perf_counter(), restore.download_ms
    downloads = SegmentDownloads(b, chain, restore)
    try:
        for first in range(0, len(units), REPLAY_INGEST_FILES):
            _replay_units(b, units[first : first + REPLAY_INGEST_FILES], restore, downloads)
    finally:
        downloads.close()
        restore.replay_ms += elapsed_ms(started) - (restore.download_ms - waited)  # not the waits for segments


def _replay_units(
    b: PhaseBackend, units: list[list[Manifest]], restore: RestoreStats, downloads: SegmentDownloads
) -> None:
    files: list[Path] = []
    try:
        for unit in units:
            change_file = b.db.write_change_file(_unit_batches(b, unit, restore, downloads), unit[-1].version)
            if change_file is not None:
                files.append(change_file)
        b.fault_point("restore:replayed")
        if files:
            b.db.ingest(*files)
    except BaseException:
        b.db.drop()
        raise
    finally:
        for f in files:
            f.unlink(missing_ok=True)  # ingested files were moved into the DB
    for unit in units:
        restore.replayed += len(unit)
        for m in unit:
            size = m.changes.ref.size if m.changes else 0
            restore.replayed_bytes += size
            b.db.changes_bytes[m.version] = size  # a restart replays them again until a snapshot


def _unit_batches(
    b: PhaseBackend, unit: list[Manifest], restore: RestoreStats, downloads: SegmentDownloads
) -> Iterator[pa.RecordBatch]:
    """The changes of one replayed SST, in key order: one version's segment as it is read, or
    consecutive versions merged."""
    if len(unit) == 1:
        return segment_batches(b, unit[0], restore=restore, downloads=downloads)
    tables = [
        pa.Table.from_batches(list(segment_batches(b, m, restore=restore, downloads=downloads)), frames.CHANGES_SCHEMA)
        for m in unit
    ]
    return frames.change_batches(newest_change_per_key(tables), APPLY_CHUNK_ROWS)


def segment_batches(
    b: PhaseBackend,
    m: Manifest,
    described: str | None = None,
    where: str | None = None,
    *,
    restore: RestoreStats | None = None,
    downloads: SegmentDownloads | None = None,
) -> Iterator[pa.RecordBatch]:
    """The segment `m` holds (a version's changes, or a compact snapshot's state), chunk by chunk; a
    damaged one raises an error naming `described` and `where` it is stored. Where it came from is
    counted in `restore`; `downloads` may have fetched it already."""
    try:
        yield from changelog.read_segment(_changes_of(b, m, restore, downloads))
    except changelog.SegmentFormatError as e:
        raise CheckpointDamagedError(
            f"{described or f'the changes of version {m.version}'} is not a changelog segment ({e})",
            store=b.ctx.store_dir,
            version=m.version,
            file=where or _changes_where(m),
        ) from None


def apply_segment(b: PhaseBackend, m: Manifest, described: str, where: str, restore: RestoreStats) -> None:
    """Ingests the segment `m` holds (a compact snapshot's state) into the local DB as one SST.
    On any failure the local DB is dropped: it matches no version."""
    change_file: Path | None = None
    try:
        batches = segment_batches(b, m, described, where, restore=restore)
        change_file = b.db.write_change_file(batches, m.version)
        if change_file is not None:
            b.db.ingest(change_file)
    except BaseException:
        b.db.drop()
        raise
    finally:
        if change_file is not None:
            change_file.unlink(missing_ok=True)  # moved into the DB when ingested


def _changes_where(m: Manifest) -> str:
    """Where a changelog version's changes are stored: their own file, or inside its manifest."""
    return (m.changes.ref.path if m.changes else "") or m.path


def _changes_of(
    b: PhaseBackend, m: Manifest, restore: RestoreStats | None = None, downloads: SegmentDownloads | None = None
) -> bytes:
    """A segment (a changelog version's changes, or a compact snapshot's state): from inside its
    manifest, from the changes kept on this host (changelog versions; size and checksum checked
    against the manifest), or downloaded and verified. Files are counted in `restore`."""
    assert m.changes is not None
    ref = m.changes.ref
    if ref.inline:
        if restore is not None:
            restore.inline_bytes += ref.size
        return ref.content(store=b.ctx.store_dir, version=m.version, name="changes")
    if m.is_changelog and b.local_copies is not None:
        kept = b.local_copies.read_changes(m.version, m.manifest_id, ref)
        if kept is not None:
            if restore is not None:
                restore.local_files += 1
                restore.local_bytes += len(kept)
            return kept
    fetched = downloads.take(m) if downloads is not None else None
    if fetched is not None:
        return fetched
    tmp = b.db.fresh_dir(f"changes-{m.version}")
    try:
        stats = download_all(b.remote, [(ref, "segment")], tmp, 1, version=m.version, hook=b.fault_point)
        if restore is not None:
            restore.downloaded(stats)
        return (tmp / "segment").read_bytes()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def changes_truncated(b: PhaseBackend, error: CheckpointMissingError) -> bool:
    """Whether the missing file of `error` is a version's changes file deleted because a snapshot
    of that version now exists (snapshots.truncate_changes): whoever planned to read it plans again
    and finds the snapshot."""
    if error.version is None or not (error.file or "").startswith("changelog/"):
        return False
    return any((key := snapshot_of(f.path)) and key[0] == error.version for f in b.remote.list_files(SNAPSHOT_DIR))


def changes_on_host(b: PhaseBackend, m: Manifest) -> bool:
    """Whether replaying changelog version `m` needs nothing from the checkpoint: its changes are
    inside its manifest, or kept on this host."""
    if m.changes is None:
        return False
    ref = m.changes.ref
    return ref.inline or (b.local_copies is not None and b.local_copies.has_changes(m.version, m.manifest_id, ref))


def newest_change_per_key(tables: list[pa.Table]) -> pa.Table:
    """The changes of consecutive versions (oldest first) as one frame in key order, holding for
    each key only its newest change: what applying them one after another leaves."""
    seq = [t.append_column("seq", pa.array([i] * t.num_rows, pa.int32())) for i, t in enumerate(tables)]
    ordered = pa.concat_tables(seq).sort_by([("key", "ascending"), ("seq", "descending")])
    keys = ordered.column("key").combine_chunks()
    if len(keys) > 1:
        first = pa.concat_arrays([pa.array([True]), pc.not_equal(keys.slice(1), keys.slice(0, len(keys) - 1))])
        ordered = ordered.filter(first)
    return ordered.drop_columns(["seq"])
