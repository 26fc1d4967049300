"""Which files a store may delete: a pure function of its manifests and a listing (DESIGN §4).

Nothing here touches storage, so the rules are tested without Spark or a filesystem, and a crash
in the middle of deleting loses nothing: the next run recomputes the same plan from what is left.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .manifest import MANIFEST_DIR, version_of_manifest
from .registry import SharedStateRegistry
from .remote import RemoteFile

DATA_DIRS = ("shared/", "private/", "changelog/")


@dataclass(frozen=True)
class RetentionPlan:
    lowest_retained: int | None
    delete_manifests: tuple[str, ...]
    delete_files: tuple[str, ...]
    kept_versions: tuple[int, ...]

    @property
    def empty(self) -> bool:
        return not self.delete_manifests and not self.delete_files


def lowest_retained_version(versions: Iterable[int], min_versions_to_retain: int) -> int | None:
    """Spark's minBatchesToRetain: keep the newest version and the `retain` before it."""
    vs = list(versions)
    if not vs:
        return None
    return max(vs) - max(min_versions_to_retain, 0)


def plan_retention(
    listing: Iterable[RemoteFile],
    referenced_by_version: Mapping[int, Iterable[str] | None],
    *,
    min_versions_to_retain: int,
    now: float,
    orphan_grace_seconds: float,
) -> RetentionPlan:
    """Plans deletions.

    `referenced_by_version` maps every version that has a manifest to the files it references, or
    to None when its manifest could not be read: then no data file is deleted at all, because what
    that version needs is unknown. Manifests below the lowest retained version go. Data files go
    when the registry rebuilt from the manifests says their last user is older than the lowest
    retained version, or when no manifest references them and they are older than the grace
    period (orphans of crashed or in-flight attempts, which another executor may still be writing).
    """
    files = list(listing)
    lowest = lowest_retained_version(referenced_by_version.keys(), min_versions_to_retain)
    if lowest is None:  # no version committed yet: only orphans of crashed first attempts can go
        orphans = tuple(sorted(f.path for f in files if now - f.mtime > orphan_grace_seconds))
        return RetentionPlan(None, (), orphans, ())
    kept = sorted(v for v in referenced_by_version if v >= lowest)
    expired_manifests = tuple(
        sorted(
            f.path
            for f in files
            if f.path.startswith(MANIFEST_DIR + "/") and (v := version_of_manifest(f.path)) is not None and v < lowest
        )
    )
    stale_temporaries = tuple(
        f.path
        for f in files
        if f.path.startswith(MANIFEST_DIR + "/")
        and version_of_manifest(f.path) is None
        and now - f.mtime > orphan_grace_seconds
    )
    if any(referenced_by_version[v] is None for v in kept):
        return RetentionPlan(lowest, expired_manifests, stale_temporaries, tuple(kept))
    registry = SharedStateRegistry.from_manifests({v: refs or () for v, refs in referenced_by_version.items()})
    unused = set(registry.unused_before(lowest))
    doomed = [
        f.path
        for f in files
        if f.path.startswith(DATA_DIRS)
        and (f.path in unused or (f.path not in registry and now - f.mtime > orphan_grace_seconds))
    ]
    return RetentionPlan(lowest, expired_manifests, tuple(sorted(doomed)) + stale_temporaries, tuple(kept))
