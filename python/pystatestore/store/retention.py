"""Which files a store may delete: a pure function of its manifests and a listing (DESIGN §4).

Nothing here touches storage, so the rules are tested without Spark or a filesystem, and a crash
in the middle of deleting loses nothing: the next run recomputes the same plan from what is left.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .leases import LEASE_DIR, attempt_token_of, live_attempts
from .manifest import MANIFEST_DIR, manifest_path, version_of_manifest
from .registry import SharedStateRegistry
from .remote import REPLACED_PREFIX, RemoteFile

DATA_DIRS = ("shared/", "private/", "changelog/", "snapshots/")
_REPLACED = re.compile(rf"^{re.escape(REPLACED_PREFIX)}(\d+)\.json-[0-9a-f]+$")


@dataclass(frozen=True)
class RetentionPlan:
    lowest_retained: int | None
    delete_manifests: tuple[str, ...]
    delete_files: tuple[str, ...]
    kept_versions: tuple[int, ...]
    delete_dirs: tuple[str, ...] = ()  # attempt directories to remove once empty
    # delete_manifests in the order garbage collection removes them, a round at a time, each made
    # durable before the next (see backends/cleanup.py); empty: one manifest a round, newest first.
    manifest_rounds: tuple[tuple[str, ...], ...] = ()

    @property
    def empty(self) -> bool:
        return not self.delete_manifests and not self.delete_files and not self.delete_dirs


def lowest_retained_version(versions: Iterable[int], min_versions_to_retain: int) -> int | None:
    """Spark's minBatchesToRetain: keep the newest version and the `retain` before it."""
    vs = list(versions)
    if not vs:
        return None
    return max(vs) - max(min_versions_to_retain, 0)


def last_published_version(listing: Iterable[RemoteFile]) -> int | None:
    """The version whose manifest was written last (the newest modification time; on a tie, the
    higher version), or None when storage gives no times. Normally the newest version. After Spark
    re-runs older batches (or a late attempt publishes), it is a lower one that the next commit is
    building on right now, unseen by garbage collection: a fast commit writes no lease."""
    written = [
        (f.mtime, v)
        for f in listing
        if f.path.startswith(MANIFEST_DIR + "/")
        and f.mtime is not None
        and (v := version_of_manifest(f.path)) is not None
    ]
    return max(written)[1] if written else None


def version_of_replaced_manifest(path: str) -> int | None:
    """The version of a manifest that `RemoteStore.publish` set aside, or None."""
    m = _REPLACED.match(path.rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


def plan_retention(
    listing: Iterable[RemoteFile],
    referenced_by_version: Mapping[int, Iterable[str] | None],
    *,
    min_versions_to_retain: int,
    now: float,
    orphan_grace_seconds: float,
    dirs: Iterable[RemoteFile] = (),
    pinned: Iterable[int] = (),
) -> RetentionPlan:
    """Plans deletions.

    `referenced_by_version` maps every version that has a manifest to the files it references, or
    to None when its manifest could not be read: then no data file is deleted at all, because what
    that version needs is unknown. Manifests below the lowest retained version go. Data files go
    when the registry rebuilt from the manifests says their last user is older than the lowest
    retained version, or when no manifest references them, they are older than the grace period
    and the attempt that wrote them holds no live lease (see leases.py). `dirs` are the attempt
    directories (`private/<v>-<token>`); those of attempts that published a manifest (they never
    write again) or that are dead (no live lease, older than the grace) are removed once empty.
    The version whose manifest was written last is kept like a retained one, whatever its number
    (`last_published_version`): after Spark re-runs older batches, the next commit builds on it.
    So are the `pinned` versions, which live commit attempts are building on (`leases.leased_bases`).
    """
    files = list(listing)
    grace = orphan_grace_seconds
    live = live_attempts(files, now=now, grace_seconds=grace)
    published = {attempt_token_of(p) for refs in referenced_by_version.values() for p in refs or ()}

    def older_than_grace(f: RemoteFile) -> bool:
        # An unknown age (object stores give directories none) is never old: age alone never
        # condemns what might still be in use.
        return f.mtime is not None and now - f.mtime > grace

    def expired_orphan(f: RemoteFile) -> bool:
        return older_than_grace(f) and attempt_token_of(f.path) not in live

    def finished_dir(d: RemoteFile) -> bool:
        token = attempt_token_of(d.path + "/")
        return token not in live and (token in published or older_than_grace(d))

    stale_leases = tuple(f.path for f in files if f.path.startswith(LEASE_DIR + "/") and older_than_grace(f))
    dead_dirs = tuple(sorted(d.path for d in dirs if finished_dir(d)))
    lowest = lowest_retained_version(referenced_by_version.keys(), min_versions_to_retain)
    if lowest is None:  # no version committed yet: only orphans of crashed first attempts can go
        orphans = tuple(sorted(f.path for f in files if f.path.startswith(DATA_DIRS) and expired_orphan(f)))
        return RetentionPlan(None, (), orphans + stale_leases, (), dead_dirs)
    # The version committed last stays too, whatever its number: the next commit may be building on
    # it (its manifest, chain and files) while this runs.
    last = last_published_version(files)
    pins = frozenset(pinned)
    kept = sorted(v for v in referenced_by_version if v >= lowest or v == last or v in pins)
    if any(referenced_by_version[v] is None for v in kept):
        # What that version needs (its chain's manifests included) is unknown: delete nothing it might.
        return RetentionPlan(lowest, (), stale_leases, tuple(kept))
    # A retained changelog version needs its chain's manifests, however old.
    needed = {p for v in kept for p in referenced_by_version[v] or ()}
    in_manifest_dir = [f for f in files if f.path.startswith(MANIFEST_DIR + "/")]
    expired_manifests = tuple(
        sorted(
            f.path
            for f in in_manifest_dir
            if (v := version_of_manifest(f.path)) is not None
            and v < lowest
            and v != last
            and v not in pins
            and f.path not in needed
        )
    )
    finals = {version_of_manifest(f.path) for f in in_manifest_dir} - {None}
    stale_manifest_files = tuple(
        f.path
        for f in in_manifest_dir
        if version_of_manifest(f.path) is None
        and (
            # a set-aside manifest is a fallback only while its version has no final manifest
            (rv := version_of_replaced_manifest(f.path)) is not None
            and ((rv < lowest and manifest_path(rv) not in needed) or (rv in finals and older_than_grace(f)))
            or rv is None
            and older_than_grace(f)  # temporaries of crashed publishes
        )
    )
    registry = SharedStateRegistry.from_manifests({v: refs or () for v, refs in referenced_by_version.items()})
    # A file the last committed version needs has its last use below `lowest` when that version is.
    unused = set(registry.unused_before(lowest)) - needed
    doomed = [
        f.path
        for f in files
        if f.path.startswith(DATA_DIRS) and (f.path in unused or (f.path not in registry and expired_orphan(f)))
    ]
    return RetentionPlan(
        lowest,
        expired_manifests,
        tuple(sorted(doomed)) + stale_manifest_files + stale_leases,
        tuple(kept),
        dead_dirs,
    )
