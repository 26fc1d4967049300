"""What a backend is given (its store's context) and gives back (load and commit results), and the
parsed-manifest cache its garbage collection keeps: plain values every backend and the service share."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from ..manifest import KEY_ENCODING_RAW, Manifest
from ..remote import RemoteFile


def elapsed_ms(started: float) -> int:
    """Milliseconds since `started` (a `time.perf_counter()` reading), for a manifest's commit_ms."""
    return int((time.perf_counter() - started) * 1000)


BACKEND_CONF = "spark.sql.streaming.stateStore.pystatestore.backend"

# Called at named points of commits and garbage collection; the model-based tests raise from it
# to simulate a worker dying between any two steps.
FaultHook = Callable[[str], None]


@dataclass(frozen=True)
class StoreContext:
    """What a backend knows of its store (from the JVM's `openStore` description)."""

    store_dir: str
    operator_id: int
    partition_id: int
    store_name: str
    key_schema: str
    value_schema: str
    min_versions_to_retain: int
    orphan_grace_seconds: float
    options: dict[str, str] = field(default_factory=dict)
    local_dir: str = ""  # scratch space on this host for the backend's working files
    # How the JVM encodes keys in change frames (manifest.KEY_ENCODING_*); recorded in manifests.
    key_encoding: str = KEY_ENCODING_RAW
    # Where the JVM asks for read views (rocksdb): every view directory must be a child of it.
    views_dir: str = ""
    # This host's base directory for pystatestore (spark.local.dir or java.io.tmpdir): the default
    # local recovery directory goes there, on the same filesystem as the local databases.
    host_dir: str = ""
    # Spark's spark.sql.streaming.stateStore.minDeltasForSnapshot: changelog versions after which
    # maintenance makes a snapshot.
    min_deltas_for_snapshot: int = 10
    # Spark's checkpoint format v2 (checkpointFormatVersion=2): each attempt's manifest is published
    # under its own id (`manifests/<version>-<id>.json`, never replaced) and Spark names the id it
    # loads; its commit log, not the last manifest written, says which attempt of a version counts.
    checkpoint_ids: bool = False

    @property
    def identity(self) -> dict[str, Any]:
        return {
            "dir": self.store_dir,
            "operatorId": self.operator_id,
            "partitionId": self.partition_id,
            "storeName": self.store_name,
        }


@dataclass(frozen=True)
class LoadResult:
    frame: pa.Buffer | None  # Arrow IPC stream (key, value) of the whole version; None for view backends
    num_keys: int
    bytes_read: int  # from checkpoint storage; 0 when served from memory or a local copy
    # "memory", "remote" (from a snapshot), "changelog" (changes replayed only), "local-copy", "local-copy+remote"
    source: str
    metrics: dict[str, int] = field(default_factory=dict)  # backend-specific, reported to Spark
    manifest_id: str = ""  # which attempt's manifest this is ("" for version 0)
    num_internal_keys: int = 0  # of num_keys, those in internal column families (Manifest)


@dataclass(frozen=True)
class CommitResult:
    version: int
    num_keys: int
    bytes_written: int
    files_written: int
    manifest: str
    metrics: dict[str, int] = field(default_factory=dict)  # backend-specific, reported to Spark
    manifest_id: str = ""
    snapshot: bool = False  # the version was committed as a snapshot (restores need no changes replayed)
    num_internal_keys: int = 0  # of num_keys, those in internal column families (Manifest)
    # The chain since the last snapshot is long enough that maintenance should make one now.
    snapshot_due: bool = False
    # What is left once the version is durable (a durable-first commit: the local DB and the view):
    # the caller runs it under the store's lock before the store's next call; it returns its metrics.
    finish: Callable[[], dict[str, int]] | None = None


class ParsedManifests:
    """Manifests garbage collection has parsed, reused while a listing shows the very same file.

    GC runs every maintenance interval for every store and needs every retained chain: at Spark's
    200 partitions, reading and parsing them again each time took more of the worker than commits.
    An entry is keyed by the size and modification time a listing gave when it was stored, and only
    files already `SETTLED_SECONDS` old are stored (git's rule for racy timestamps): a replacement
    written later has a later time, so it can never be taken for the cached file, even where storage
    keeps times to the second. Only manifests that passed the store's identity check are stored."""

    SETTLED_SECONDS = 3.0

    def __init__(self) -> None:
        self._entries: dict[str, tuple[int, float, Manifest]] = {}

    def get(self, listed: RemoteFile | None) -> Manifest | None:
        if listed is None:
            return None
        entry = self._entries.get(listed.path)
        return entry[2] if entry is not None and entry[:2] == (listed.size, listed.mtime) else None

    def put(self, listed: RemoteFile | None, m: Manifest, now: float) -> None:
        if listed is not None and listed.mtime is not None and now - listed.mtime >= self.SETTLED_SECONDS:
            self._entries[listed.path] = (listed.size, listed.mtime, m)

    def keep_only(self, paths: set[str]) -> None:
        """Forgets files no longer listed (collected, or set aside)."""
        for path in [p for p in self._entries if p not in paths]:
            del self._entries[path]

    def __len__(self) -> int:
        return len(self._entries)
