"""Reading committed versions: a version's state left as a read view for the JVM (DESIGN §2: Python
writes, the JVM reads), Spark's replay from a chosen snapshot, and the change feed."""

from __future__ import annotations

import itertools
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from ...errors import (
    CheckpointDamagedError,
    CheckpointMissingError,
    StateStoreError,
    StoreConfigError,
    VersionReplacedError,
)
from ...manifest import (
    MANIFEST_DIR,
    SNAPSHOT_DIR,
    Manifest,
    checkpoint_id_of_manifest,
    manifest_path,
    snapshot_of,
    version_of_manifest,
)
from ..context import LoadResult, elapsed_ms
from .replay import changes_truncated, replay_chain, segment_batches
from .restore import ensure_at, restore_snapshot
from .restore_stats import RestoreStats

if TYPE_CHECKING:
    from .phase_backend import PhaseBackend


def load(b: PhaseBackend, version: int, view_dir: str | None, checkpoint_id: str | None = None) -> LoadResult:
    """See RocksDBBackend.load."""
    target = view_target(b, view_dir, version) if view_dir is not None else None
    _, cost = ensure_at(b, version, checkpoint_id)
    return leave_view(b, target, cost)


def view_after_commit(b: PhaseBackend, version: int, manifest_id: str, view_dir: str) -> LoadResult:
    """The read view a durable-first commit's apply did not leave (it failed, or its worker died):
    `version`, the attempt `manifest_id` this JVM committed, loaded at `view_dir` in place of what a
    failed apply left there. Refused when another attempt has since replaced that version."""
    target = Path(os.path.abspath(view_dir))
    if b.ctx.views_dir and target.parent == Path(os.path.abspath(b.ctx.views_dir)):
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.is_dir():
            shutil.rmtree(target)
    target = view_target(b, view_dir, version)
    _, cost = ensure_at(b, version, b.attempt_for_lookup(manifest_id))
    if b.db.manifest_id != manifest_id:
        raise VersionReplacedError(
            f"this JVM committed attempt {manifest_id} of version {version}, but the checkpoint now holds "
            f"attempt {b.db.manifest_id or '(none)'}",
            store=b.ctx.store_dir,
            version=version,
            file=manifest_path(version),
        )
    return leave_view(b, target, cost)


def leave_view(b: PhaseBackend, target: Path | None, cost: dict[str, int]) -> LoadResult:
    """A checkpoint of the local DB at `target` (when given) and what the load cost and came from."""
    if target is not None:
        t = time.perf_counter()
        b.db.checkpoint(target)
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
        b.db.num_keys,
        cost.get("restoreRemoteBytes", 0) + cost.get("restoreInlineBytes", 0),
        source,
        cost,
        manifest_id=b.db.manifest_id or "",
        num_internal_keys=b.db.num_internal_keys,
    )


def replay_from_snapshot(
    b: PhaseBackend,
    snapshot_version: int,
    end_version: int,
    view_dir: str | None,
    *,
    snapshot_id: str | None = None,
    end_id: str | None = None,
) -> LoadResult:
    """See RocksDBBackend.replay."""
    target = view_target(b, view_dir, end_version) if view_dir is not None else None
    started = time.perf_counter()
    end = b.read_manifest(end_version, end_id)
    chain: list[Manifest] = []
    base: Manifest | None = None
    own_manifest = False
    for m in b.chain_back(end):
        if m.version == snapshot_version:
            if snapshot_id is not None and m.manifest_id != snapshot_id:
                raise StoreConfigError(
                    f"attempt {end.manifest_id} of version {end_version} was committed on attempt {m.manifest_id} "
                    f"of version {snapshot_version}, not on the attempt {snapshot_id} asked for",
                    store=b.ctx.store_dir,
                    version=snapshot_version,
                    file=m.path,
                    advice="Take both checkpoint ids from the same commit log (the state data source does).",
                )
            own_manifest = not m.is_changelog
            base = m if own_manifest else b.read_snapshot(m.version, m.manifest_id)
            break
        chain.append(m)
    if base is None:
        have = snapshot_versions(b)
        raise StoreConfigError(
            f"there is no snapshot of version {snapshot_version} to replay version {end_version} from "
            f"(snapshots: {', '.join(map(str, have[-20:])) or 'none'})",
            store=b.ctx.store_dir,
            version=snapshot_version,
            file=manifest_path(snapshot_version),
            advice="Pick a snapshotStartBatchId whose version (batch id + 1) has a snapshot, or read without it.",
        )
    restore = RestoreStats()
    restore_snapshot(b, base, restore, own_manifest=own_manifest)
    try:
        replay_chain(b, list(reversed(chain)), restore)
    except CheckpointMissingError as e:
        raise truncated_changes_error(b, e, f"replaying version {end_version} from snapshot {snapshot_version}") from e
    b.db.set_version(end.version, end)
    return leave_view(b, target, restore.cost(started))


def snapshot_versions(b: PhaseBackend) -> list[int]:
    """Versions that have a snapshot (their own manifest, or one maintenance made)."""
    found = set()
    for f in b.remote.list_files(MANIFEST_DIR):
        v = version_of_manifest(f.path)
        if v is not None:
            try:
                if not b.read_manifest(v, checkpoint_id_of_manifest(f.path)).is_changelog:
                    found.add(v)
            except (CheckpointDamagedError, StoreConfigError, OSError):
                continue
    for f in b.remote.list_files(SNAPSHOT_DIR):
        key = snapshot_of(f.path)
        if key is not None:
            found.add(key[0])
    return sorted(found)


def changes(
    b: PhaseBackend, start_version: int, end_version: int, end_id: str | None = None
) -> Iterator[tuple[int, pa.RecordBatch]]:
    """The change feed: each version's changes (op, key, value), start to end inclusive. With
    `end_id` (checkpoint format v2) the versions are those attempt `end_id` of `end_version` was
    committed on, found back along its chain."""
    if end_id is None:
        versions: Iterator[Manifest] = (b.read_manifest(v) for v in range(start_version, end_version + 1))
    else:
        end = b.read_manifest(end_version, end_id)
        versions = reversed(list(itertools.takewhile(lambda m: m.version >= start_version, b.chain_back(end))))
    for m in versions:
        v = m.version
        if not m.is_changelog:
            raise StoreConfigError(
                f"version {v} was committed as a snapshot, which records no changes",
                store=b.ctx.store_dir,
                version=v,
                file=m.path,
                advice="The change feed needs changelog commits: read from a batch committed with "
                "spark.sql.streaming.stateStore.pystatestore.commitMode=changelog (the default).",
            )
        try:
            yield from ((v, batch) for batch in segment_batches(b, m))
        except CheckpointMissingError as e:
            raise truncated_changes_error(b, e, "the change feed") from e


def truncated_changes_error(b: PhaseBackend, e: CheckpointMissingError, reading: str) -> StateStoreError:
    """`e`, or when its file is the changes of a version that has a snapshot (deleted once the
    snapshot was made, decision 0043), an error that says so and what to set."""
    if not changes_truncated(b, e):
        return e
    return StoreConfigError(
        f"{reading} needs the changes of version {e.version}, which were deleted once a snapshot of that version "
        "was made (the snapshot holds its state, not its changes)",
        store=b.ctx.store_dir,
        version=e.version,
        file=e.file,
        advice="Read from a later version, or set spark.sql.streaming.stateStore.pystatestore.keepSnapshottedChanges"
        "=true to keep every retained version's changes (versions snapshotted before that keep none).",
    )


def view_target(b: PhaseBackend, view_dir: str | None, version: int) -> Path:
    """`view_dir`, checked to be a new directory directly inside the JVM's views directory: the
    worker writes nowhere else on the JVM's behalf."""
    if not view_dir or not b.ctx.views_dir:
        raise StoreConfigError(
            "the rocksdb backend is read through views, but no view directory was given",
            store=b.ctx.store_dir,
            version=version,
            advice="The JVM shim and the Python package are of different pystatestore releases; install the "
            "same release for both.",
        )
    target = Path(os.path.abspath(view_dir))
    if target.parent != Path(os.path.abspath(b.ctx.views_dir)) or os.path.lexists(target):
        raise StoreConfigError(
            f"view directory {view_dir} is not a new directory inside {b.ctx.views_dir}",
            store=b.ctx.store_dir,
            version=version,
        )
    return target
