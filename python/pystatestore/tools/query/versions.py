"""A store's committed versions opened for answering questions: each one a read-only RocksDB checkpoint
of a local DB that follows the store forward (StoreFollower), shared by the answers reading it and
closed once the last lets go (OpenVersion). Nothing here writes into the checkpoint: restores go to
the reader's own scratch space, and no lease is taken, so the query's GC is never held back."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from ...store.errors import StateStoreError
from ...store.manifest import KEY_ENCODING_FAMILIES
from ..checkpoint import StoreLocation
from ..families import REGISTRY_ID, Family, family_prefix, registry
from ..store_reader import StoreReader, open_read_only
from ..unsafe_row import SparkType, parse_schema


class OpenVersion:
    """One version of one store, open read-only. Its owner (a served batch) holds one reference;
    each answer reading it holds another while it reads. The last release closes the DB and removes
    its directory, so a newer batch never pulls a view from under an answer."""

    def __init__(
        self,
        location: StoreLocation,
        version: int,
        db: Any,
        path: Path | None,
        schemas: tuple[str, str, str],
        discard: Callable[[Path], None] | None = None,
    ) -> None:
        """`discard` removes the version's directory once closed (default: here, now)."""
        self.location = location
        self.version = version
        self.db = db  # a rocksdict.Rdict, or a dict (frame backends)
        self.path = path
        self._discard = discard or _remove_tree
        self.key_schema, self.value_schema, self.key_encoding = schemas
        self._refs = 1
        self._lock = threading.Lock()
        self._families: dict[str, Family] | None = None
        self._types: dict[str, SparkType] = {}

    def type_of(self, schema: str) -> SparkType:
        """A schema of this version (its own, or a state variable's) parsed once."""
        t = self._types.get(schema)
        if t is None:
            t = self._types[schema] = parse_schema(schema)
        return t

    def acquire(self) -> bool:
        with self._lock:
            if self._refs == 0:
                return False
            self._refs += 1
            return True

    def release(self) -> None:
        with self._lock:
            self._refs -= 1
            last = self._refs == 0
        if last:
            if hasattr(self.db, "close"):
                self.db.close()
            if self.path is not None:
                self._discard(self.path)

    def get(self, stored_key: bytes) -> bytes | None:
        value = self.db.get(stored_key)
        return None if value is None else bytes(value)

    def get_many(self, stored_keys: list[bytes]) -> list[bytes | None]:
        if not stored_keys:
            return []
        if isinstance(self.db, dict):
            return [self.db.get(k) for k in stored_keys]
        return [None if v is None else bytes(v) for v in self.db.get(stored_keys)]

    def items(self, prefix: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        """(key, value) in key order, only keys starting with `prefix`."""
        if isinstance(self.db, dict):
            source: Iterator[tuple[bytes, bytes]] = iter(sorted(self.db.items()))
            for k, v in source:
                if k.startswith(prefix):
                    yield k, v
            return
        for k, v in self.db.items(from_key=prefix) if prefix else self.db.items():
            if not k.startswith(prefix):
                return
            yield bytes(k), bytes(v)

    @property
    def has_families(self) -> bool:
        return self.key_encoding == KEY_ENCODING_FAMILIES

    def families(self) -> dict[str, Family]:
        """transformWithState: the column families this version's registry records."""
        if self._families is None:
            self._families = registry(self.items(family_prefix(REGISTRY_ID))) if self.has_families else {}
        return self._families


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def open_restored(
    location: StoreLocation,
    version: int,
    path: Path,
    schemas: tuple[str, str, str],
    options_factory: Any,
    discard: Callable[[Path], None] | None = None,
) -> OpenVersion:
    """A version's restored checkpoint directory opened read-only; removed (by `discard`) once closed,
    or now if it cannot be opened."""
    options = options_factory() if options_factory is not None else None
    try:
        db = open_read_only(path, options)
    except Exception:
        (discard or _remove_tree)(path)
        raise
    return OpenVersion(location, version, db, path, schemas, discard)


class Follower(Protocol):
    """A store read as the query commits: versions opened in order."""

    version: int

    def open(self, version: int, checkpoint_id: str | None = None) -> OpenVersion: ...

    def close(self) -> None: ...


class StoreFollower:
    """One store read as the query commits: a StoreReader whose local DB is brought forward to each
    newer version asked for (replaying only what changed since the last), each left as an OpenVersion.
    Versions must be asked for in order; an older one needs a follower of its own."""

    def __init__(self, location: StoreLocation, scratch: str | None, options_factory: Any = None) -> None:
        self.location = location
        self.reader = StoreReader(location, scratch)
        self._options_factory = options_factory
        self._lock = threading.RLock()
        self._opened = 0
        self.version = 0  # the newest version opened
        self._schemas: tuple[str, str, str] | None = None

    def open(self, version: int, checkpoint_id: str | None = None) -> OpenVersion:
        """`version` opened: its own checkpoint directory of the local DB. Raises the store's own
        error (naming store, version and file) when a file is missing or damaged."""
        with self._lock:
            if self.reader.reads_frames:
                self._check_order(version)
                db = self.reader.open_version(version, "", checkpoint_id)
                self.version = version
                return OpenVersion(self.location, version, db, None, self._schemas_of(version, checkpoint_id))
            path, schemas = self.restore(version, checkpoint_id)
        return open_restored(self.location, version, path, schemas, self._options_factory)

    def restore(self, version: int, checkpoint_id: str | None = None) -> tuple[Path, tuple[str, str, str]]:
        """`version` restored (RocksDB backends) and left as a checkpoint directory of the local DB,
        not opened (whoever opens it removes it once done); with the version's schemas."""
        with self._lock:
            self._check_order(version)
            self._opened += 1
            path = self.reader.checkpoint_version(version, f"v{version}-{self._opened}", checkpoint_id)
            self.version = version
            return path, self._schemas_of(version, checkpoint_id)

    def _check_order(self, version: int) -> None:
        if version < self.version:
            raise StateStoreError(
                f"version {version} is older than {self.version}, which this follower has opened",
                store=self.location.uri,
                version=version,
            )

    def _schemas_of(self, version: int, checkpoint_id: str | None) -> tuple[str, str, str]:
        """The version's schemas: its manifest's when it records them (snapshots, a chain's first
        version), else those of the version before, which it continues; walking the chain back only
        the first time."""
        m = self.reader.backend.read_manifest(version, checkpoint_id or self.reader.attempts.get(version))
        if m.key_schema:
            self._schemas = (m.key_schema, m.value_schema, m.key_encoding)
        elif self._schemas is None:
            self._schemas = self.reader.schemas(version)
        return self._schemas

    def close(self) -> None:
        with self._lock:
            self.reader.close()


__all__ = ["Follower", "OpenVersion", "StoreFollower", "open_restored"]
