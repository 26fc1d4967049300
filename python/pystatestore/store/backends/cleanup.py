"""Garbage collection of one store, the backend's side of retention (DESIGN §4): what maintenance's
cleanup deletes, and deleting it. It lists what the store holds and the leases of live commit
attempts, works out what each version needs (its chain back to a snapshot), and hands that to the
pure `retention.plan_retention`. StateBackend's `maintenance`, `plan_maintenance`,
`needs_by_version` and `dependencies` are its entry points."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from typing import Protocol

from ..errors import CheckpointDamagedError, CheckpointMissingError, StoreConfigError
from ..leases import LEASE_DIR, LeaseUnreadableError, read_leased_bases
from ..manifest import (
    MANIFEST_DIR,
    SNAPSHOT_DIR,
    Manifest,
    checkpoint_id_of_manifest,
    manifest_path,
    snapshot_of,
    snapshot_path,
    version_of_manifest,
)
from ..remote import RemoteFile, RemoteStore
from ..retention import (
    RetentionPlan,
    last_published_version,
    lowest_retained_version,
    plan_retention,
    version_of_replaced_manifest,
)
from .context import ParsedManifests, StoreContext

log = logging.getLogger("pystatestore.backends")


class CollectedStore(Protocol):
    """What garbage collection uses of a backend (StateBackend has all of it): the store, the
    manifests parsed by earlier runs, and reading manifests checked to be this store's."""

    ctx: StoreContext
    remote: RemoteStore
    parsed: ParsedManifests
    keeps_snapshotted_changes: bool

    def read_any_manifest(self, version: int, checkpoint_id: str | None = None) -> Manifest: ...

    def read_snapshot(self, version: int, manifest_id: str) -> Manifest | None: ...

    def chain_back(self, m: Manifest, cache: dict[str, Manifest] | None = None) -> Iterator[Manifest]: ...

    def check_identity(self, m: Manifest, rel: str) -> None: ...


def plan(b: CollectedStore, now: float) -> RetentionPlan:
    """What a cleanup at `now` deletes (StateBackend.plan_maintenance), deleting nothing."""
    manifests = b.remote.list_files(MANIFEST_DIR)
    leases = b.remote.list_files(LEASE_DIR)
    data_files = [f for d in ("private", "shared", "changelog", SNAPSHOT_DIR) for f in b.remote.list_files(d)]
    attempt_dirs = b.remote.list_dirs("private")
    versions = {v for f in manifests if (v := version_of_manifest(f.path)) is not None}
    pinned: frozenset[int] = frozenset()
    planned: RetentionPlan | None = None
    read: dict[str, Manifest] = {}  # the manifests the last plan read, by path
    listing = leases
    while True:
        try:
            found = read_leased_bases(
                b.remote, listing, now=now, grace_seconds=b.ctx.orphan_grace_seconds, versions=versions
            )
        except LeaseUnreadableError as e:
            log.warning("%s", e)  # what that lease pins is unknown: delete nothing this run
            return RetentionPlan(None, (), (), ())
        if planned is not None and found <= pinned:
            return replace(planned, manifest_rounds=removal_rounds(planned.delete_manifests, read))
        pinned |= found
        read = {}
        refs = needs_by_version(b, manifests, data_files, now=now, pinned=pinned, seen=read)
        planned = plan_retention(
            manifests + leases + data_files,
            refs,
            min_versions_to_retain=b.ctx.min_versions_to_retain,
            now=now,
            orphan_grace_seconds=b.ctx.orphan_grace_seconds,
            dirs=attempt_dirs,
            pinned=pinned,
        )
        # A commit on an older version may have pinned it while this planned: look again right
        # before deleting (the commit checks its base's files once more before it publishes).
        listing = b.remote.list_files(LEASE_DIR)


def removal_rounds(doomed: Iterable[str], read: Mapping[str, Manifest]) -> tuple[tuple[str, ...], ...]:
    """`doomed` (manifests to remove) in rounds: no manifest in a round is on the chain of another
    in the same round or a later one, so removing a round in any order, once every earlier round's
    removals are durable, leaves every remaining manifest's chain whole, whichever of the round's
    removals a power cut keeps. A changelog manifest's chain reaches its base version's manifest,
    unless a snapshot of it was read (restores and `verify` stop there); `read` (manifests and
    snapshot manifests, by path) gives each one's kind, and one it lacks is taken to reach its base.
    A chain since the last snapshot is one round per version; snapshot commits are one round."""
    doomed = list(doomed)
    by_version: dict[int, list[str]] = {}
    for rel in doomed:
        by_version.setdefault(version_of_manifest(rel) or -1, []).append(rel)
    level = dict.fromkeys(doomed, 0)
    for rel in sorted(doomed, key=lambda r: version_of_manifest(r) or -1, reverse=True):  # children first
        m = read.get(rel)
        if m is not None and (not m.is_changelog or snapshot_path(m.version, m.manifest_id) in read):
            continue  # its chain ends here
        for parent in by_version.get((version_of_manifest(rel) or -1) - 1, ()):  # any attempt: the one it names
            level[parent] = max(level[parent], level[rel] + 1)
    rounds: dict[int, list[str]] = {}
    for rel in doomed:
        rounds.setdefault(level[rel], []).append(rel)
    return tuple(tuple(sorted(rounds[n])) for n in sorted(rounds))


def delete(remote: RemoteStore, planned: RetentionPlan, fault_point: Callable[[str], None]) -> int:
    """Deletes what `planned` names; returns how many attempt directories it removed. Manifests go
    first, so a crash part-way leaves only unreferenced files, which the next run (recomputing the
    same plan) removes."""
    # A round at a time (`removal_rounds`: newest first along each chain), each round's removals
    # durable before the next round starts: a power cut may keep any of the removals not yet
    # synced, not only a first part of them, so removals along a chain without a sync in between
    # could keep an older manifest's removal and undo a newer one's, leaving that one with a hole
    # in its chain. Snapshot manifests go next (no manifest left needs them), made durable before
    # any file goes, or a power cut could bring a manifest back whose files were gone for good.
    rounds = planned.manifest_rounds
    if sorted(r for group in rounds for r in group) != sorted(planned.delete_manifests):
        newest_first = sorted(planned.delete_manifests, key=lambda rel: version_of_manifest(rel) or -1, reverse=True)
        rounds = tuple((rel,) for rel in newest_first)
    snapshots = [r for r in planned.delete_files if r.startswith(SNAPSHOT_DIR + "/")]
    files = [r for r in planned.delete_files if not r.startswith(SNAPSHOT_DIR + "/")]
    for n, group in enumerate(rounds):
        for rel in group:
            remote.delete(rel)
            fault_point("gc:deleted")
        if n + 1 < len(rounds) or snapshots or files:
            remote.sync_removals(group)
    for rel in snapshots:
        remote.delete(rel)
        fault_point("gc:deleted")
    if snapshots and files:
        remote.sync_removals(snapshots)
    for rel in files:
        remote.delete(rel)
        fault_point("gc:deleted")
    return sum(remote.remove_dir_if_empty(d) for d in planned.delete_dirs)


def needs_by_version(
    b: CollectedStore,
    manifests: list[RemoteFile],
    data_files: list[RemoteFile],
    *,
    now: float,
    pinned: frozenset[int] = frozenset(),
    seen: dict[str, Manifest] | None = None,
) -> dict[int, list[str] | None]:
    """What each version with a manifest needs (None: a manifest of it is unreadable); `seen`, when
    given, gets every manifest read or reused on the way, and the snapshot manifests read of the
    versions on their way out, by path. A retained
    version needs its whole chain back to a snapshot; so do the version committed last, which
    retention keeps whatever its number (the next commit builds on it), and the `pinned` ones
    (live commit attempts build on them); an older one, only what it names itself (it is going,
    and with it what only it used). Under checkpoint format v2 a version needs what each of its
    attempts does: any of them may be the one Spark's commit log names."""
    snapshots = {key: f for f in data_files if f.path.startswith(SNAPSHOT_DIR + "/") and (key := snapshot_of(f.path))}
    attempts: dict[int, list[str | None]] = {}
    for f in manifests:
        if (v := version_of_manifest(f.path)) is not None:
            attempts.setdefault(v, []).append(checkpoint_id_of_manifest(f.path))
        elif (v := version_of_replaced_manifest(f.path)) is not None:
            attempts.setdefault(v, [])
    lowest = lowest_retained_version(attempts, b.ctx.min_versions_to_retain)
    last = last_published_version(manifests)
    refs: dict[int, list[str] | None] = {}
    # Manifests parsed by earlier runs and unchanged since (checked to be this store's, as the
    # chains need them); the rest are read once per run.
    cache: dict[str, Manifest] = _listed_manifests(b, manifests)
    unchecked: dict[str, Manifest] = {}
    for v in sorted(attempts, reverse=True):
        needed: set[str] = set()
        try:
            for cid in attempts[v] or [None]:  # None: a set-aside manifest only (RemoteStore.publish)
                m = cache.get(manifest_path(v, cid))
                if m is None:
                    m = b.read_any_manifest(v, cid)
                    unchecked[m.path] = m
                if lowest is not None and (v >= lowest or v == last or v in pinned):
                    needed |= dependencies(b, m, snapshots=snapshots, now=now, cache=cache)
                    continue
                # A version on its way out: its own files and the snapshot made of it, so the
                # registry sees when they were last used and frees them at once when no
                # retained version's chain needs them (rather than after the orphan grace).
                needed |= {f.path for f in m.files()}
                snap = snapshots.get((v, m.manifest_id))
                materialized = _listed_snapshot(b, snap, m, now) if snap is not None else None
                if snap is not None and materialized is not None:
                    needed |= {snap.path, *(f.path for f in materialized.files())}
                    if seen is not None:
                        seen[snap.path] = materialized
            refs[v] = sorted(needed)
        except (CheckpointDamagedError, CheckpointMissingError):
            refs[v] = None  # unknown needs: keep every data file
    if seen is not None:
        seen.update({**unchecked, **cache})
    _remember_manifests(b, manifests, {**unchecked, **cache}, now)
    b.parsed.keep_only({f.path for f in manifests} | {f.path for f in snapshots.values()})
    return refs


def dependencies(
    b: CollectedStore,
    m: Manifest,
    *,
    snapshots: Mapping[tuple[int, str], RemoteFile],
    now: float,
    cache: dict[str, Manifest] | None = None,
) -> set[str]:
    """Every file a version needs to be restored: for a changelog version, its chain's manifests
    and changes back to a snapshot. While the newest snapshot on the chain is younger than the
    grace period, the chain back to the snapshot before it counts too: restores that began
    before the new snapshot appeared are still walking it, and a snapshot being made may reuse
    its files. Older chains go: a long-running query keeps about `minBatchesToRetain` versions
    plus one snapshot interval, not everything of the last grace period. A version that has a
    snapshot needs no changes file of its own (decision 0043): the snapshot holds its state, and
    the file goes unless the backend keeps them (for the change feed)."""
    if not m.is_changelog:
        return {f.path for f in m.files()}
    needed: set[str] = set()
    grace = b.ctx.orphan_grace_seconds
    found = 0
    chain = b.chain_back(m, cache)
    while True:
        try:
            c = next(chain)
        except StopIteration:
            break
        except CheckpointMissingError:
            if found:
                # Past a snapshot this version restores from, GC already took the older chain (the
                # versions it was kept for left the retained range): nothing there to keep.
                break
            raise
        needed.add(c.path)
        if not c.is_changelog:
            needed.update(f.path for f in c.files())
            break
        snap = snapshots.get((c.version, c.manifest_id))
        materialized = _listed_snapshot(b, snap, c, now) if snap is not None else None
        if snap is None or materialized is None:
            needed.update(f.path for f in c.files())
            continue
        if b.keeps_snapshotted_changes:
            needed.update(f.path for f in c.files())
        needed.add(snap.path)
        needed.update(f.path for f in materialized.files())
        found += 1
        settled = snap.mtime is not None and now - snap.mtime > grace
        if settled or found == 2:
            break
    return needed


def _listed_snapshot(b: CollectedStore, snap: RemoteFile, m: Manifest, now: float) -> Manifest | None:
    """`read_snapshot` of the listed snapshot file `snap` of `m`, from `parsed` when unchanged."""
    found = b.parsed.get(snap)
    if found is None:
        found = b.read_snapshot(m.version, m.manifest_id)
        if found is not None:
            b.parsed.put(snap, found, now)
    return found


def _listed_manifests(b: CollectedStore, manifests: list[RemoteFile]) -> dict[str, Manifest]:
    """The listed manifests `parsed` holds unchanged, by path."""
    found = {}
    for f in manifests:
        if version_of_manifest(f.path) is not None and (m := b.parsed.get(f)) is not None:
            found[f.path] = m
    return found


def _remember_manifests(
    b: CollectedStore, manifests: list[RemoteFile], read: Mapping[str, Manifest], now: float
) -> None:
    for f in manifests:
        v = version_of_manifest(f.path)
        m = read.get(f.path) if v is not None else None
        if m is None or m.version != v or b.parsed.get(f) is m:
            continue
        try:
            b.check_identity(m, f.path)
        except (CheckpointDamagedError, StoreConfigError):
            continue  # GC reads it again each time, and every load refuses it
        b.parsed.put(f, m, now)
