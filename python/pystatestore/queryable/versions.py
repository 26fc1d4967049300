"""A store's committed versions opened for answering questions: each one a read-only RocksDB checkpoint
of a local DB that follows the store forward (StoreFollower), shared by the answers reading it and
closed once the last lets go (OpenVersion). Nothing here writes into the checkpoint: restores go to
the reader's own scratch space, and no lease is taken, so the query's GC is never held back."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from ..reading.checkpoint import StoreLocation
from ..reading.families import REGISTRY_ID, Family, family_prefix, registry
from ..reading.store_reader import StoreReader, open_read_only
from ..reading.unsafe_row import SparkType, parse_schema
from ..store.errors import StateStoreError
from ..store.manifest import KEY_ENCODING_FAMILIES
from .layers import ABSENT, Changed, ChangeLayer, LayerBudget, ViewAt, changes_since, layered_get, layered_items


class OpenDB:
    """A version's DB open for reading, shared by the versions served on it (layers.py); closed, and
    its directory removed by `discard`, when the last of them lets go."""

    def __init__(self, db: Any, path: Path | None, discard: Callable[[Path], None] | None = None) -> None:
        self.db = db  # a rocksdict.Rdict, or a dict (frame backends)
        self.path = path
        self._discard = discard or _remove_tree
        self._refs = 1
        self._lock = threading.Lock()

    def acquire(self) -> None:
        """(By a holder.) Another version served on this DB."""
        with self._lock:
            self._refs += 1

    def release(self) -> None:
        with self._lock:
            self._refs -= 1
            last = self._refs == 0
        if last:
            if hasattr(self.db, "close"):
                self.db.close()
            if self.path is not None:
                self._discard(self.path)


class OpenVersion:
    """One version of one store, open read-only: a DB, with the changes of the versions after the
    DB's own on top when it is served from memory (`layers`, newest first). Its owner (a served
    batch) holds one reference; each answer reading it holds another while it reads. The last
    release lets go of the DB, so a newer batch never pulls a view from under an answer."""

    def __init__(
        self,
        location: StoreLocation,
        version: int,
        db: Any,
        path: Path | None,
        schemas: tuple[str, str, str],
        discard: Callable[[Path], None] | None = None,
        *,
        base: OpenDB | None = None,
        layers: tuple[ChangeLayer, ...] = (),
    ) -> None:
        """`discard` removes the version's directory once closed (default: here, now). With `base`
        (already acquired for this version) `db`, `path` and `discard` are the base's."""
        self.location = location
        self.version = version
        self._base = base if base is not None else OpenDB(db, path, discard)
        self.db = self._base.db
        self.path = self._base.path
        self.layers = layers
        self.key_schema, self.value_schema, self.key_encoding = schemas
        self._refs = 1
        self._lock = threading.Lock()
        self._families: dict[str, Family] | None = None
        self._types: dict[str, SparkType] = {}

    def with_changes(self, version: int, layers: list[ChangeLayer]) -> OpenVersion:
        """(By a holder.) `version`: this one's DB and layers with `layers` (oldest first) on top."""
        self._base.acquire()
        schemas = (self.key_schema, self.value_schema, self.key_encoding)
        return OpenVersion(
            self.location, version, None, None, schemas, base=self._base, layers=(*reversed(layers), *self.layers)
        )

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
            self._base.release()

    def get(self, stored_key: bytes) -> bytes | None:
        if self.layers and (changed := layered_get(self.layers, stored_key)) is not ABSENT:
            return changed
        value = self.db.get(stored_key)
        return None if value is None else bytes(value)

    def get_many(self, stored_keys: list[bytes]) -> list[bytes | None]:
        if self.layers:
            changed = [layered_get(self.layers, k) for k in stored_keys]
            unchanged = [k for k, c in zip(stored_keys, changed, strict=True) if c is ABSENT]
            from_db = iter(self._db_get_many(unchanged))
            return [next(from_db) if c is ABSENT else c for c in changed]
        return self._db_get_many(stored_keys)

    def _db_get_many(self, stored_keys: list[bytes]) -> list[bytes | None]:
        if not stored_keys:
            return []
        if isinstance(self.db, dict):
            return [self.db.get(k) for k in stored_keys]
        return [None if v is None else bytes(v) for v in self.db.get(stored_keys)]

    def items(self, prefix: bytes = b"", after: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) in key order, only keys starting with `prefix`; with `after` (a key under
        `prefix`), only the keys above it: where a scan's page left off."""
        if self.layers:
            yield from layered_items(self.layers, self._db_items(prefix, after), prefix, after)
        else:
            yield from self._db_items(prefix, after)

    def _db_items(self, prefix: bytes, after: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        if isinstance(self.db, dict):
            source: Iterator[tuple[bytes, bytes]] = iter(sorted(self.db.items()))
            for k, v in source:
                if k.startswith(prefix) and (after is None or k > after):
                    yield k, v
            return
        start = after if after is not None else prefix
        for k, v in self.db.items(from_key=start) if start else self.db.items():
            if not k.startswith(prefix):
                return
            if after is not None and k == after:
                continue
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


Restored = tuple[Path, tuple[str, str, str], str]  # a version's checkpoint directory, schemas, manifest id


class Tip:
    """The newest version a follower served, held (one reference) so that the next can be served
    on its DB with the changes after it on top (layers.py), and where it stands."""

    def __init__(self, budget: LayerBudget | None = None) -> None:
        self._opened: OpenVersion | None = None
        self.at: ViewAt | None = None
        self._budget = budget

    def since(self) -> ViewAt | None:
        """What the next version may be served on, if anything."""
        if self._opened is None or self.at is None:
            return None
        return self.at if self._budget is None else replace(self.at, budget=self._budget.room())

    def changed(self, version: int, step: Changed) -> OpenVersion:
        """`version` served as the tip with `step`'s changes on top."""
        assert self._opened is not None and self.at is not None
        opened = self._opened.with_changes(version, [layer for _, layer in step.layers])
        at = ViewAt(version, step.manifest_id, self.at.layers + len(step.layers), self.at.layer_bytes + step.nbytes)
        return self._keep(opened, at)

    def restored(self, opened: OpenVersion, manifest_id: str) -> OpenVersion:
        """A restored version, the base of those after it."""
        return self._keep(opened, ViewAt(opened.version, manifest_id))

    def serve(
        self,
        location: StoreLocation,
        version: int,
        step: Changed | Restored,
        options_factory: Any,
        discard: Callable[[Path], None] | None = None,
    ) -> OpenVersion:
        """`version` as a follower's advance left it: built on the tip, or its restored directory
        opened read-only (removed by `discard` once closed) as the new tip."""
        if isinstance(step, Changed):
            return self.changed(version, step)
        path, schemas, manifest_id = step
        return self.restored(open_restored(location, version, path, schemas, options_factory, discard), manifest_id)

    def _keep(self, opened: OpenVersion, at: ViewAt) -> OpenVersion:
        opened.acquire()
        old, self._opened, self.at = self._opened, opened, at
        if self._budget is not None:
            self._budget.hold(self, at.layer_bytes)
        if old is not None:
            old.release()
        return opened

    def close(self) -> None:
        old, self._opened, self.at = self._opened, None, None
        if self._budget is not None:
            self._budget.hold(self, 0)
        if old is not None:
            old.release()


class StoreFollower:
    """One store read as the query commits: a StoreReader whose local DB is brought forward to each
    newer version asked for that cannot be served on the last (replaying only what changed since
    the DB's version), each left as an OpenVersion. Versions must be asked for in order; an older
    one needs a follower of its own."""

    def __init__(
        self,
        location: StoreLocation,
        scratch: str | None,
        options_factory: Any = None,
        budget: LayerBudget | None = None,
    ) -> None:
        """`budget`: the layer bytes shared with the client's other followers."""
        self.location = location
        self.reader = StoreReader(location, scratch)
        self._options_factory = options_factory
        self._lock = threading.RLock()
        self._opened = 0
        self.version = 0  # the newest version opened
        self._schemas: tuple[str, str, str] | None = None
        self._tip = Tip(budget)

    def open(self, version: int, checkpoint_id: str | None = None) -> OpenVersion:
        """`version` opened: the last version served with its changes on top, or its own
        checkpoint directory of the local DB. Raises the store's own error (naming store, version
        and file) when a file is missing or damaged."""
        with self._lock:
            if self.reader.reads_frames:
                self._check_order(version)
                db = self.reader.open_version(version, "", checkpoint_id)
                self.version = version
                return OpenVersion(self.location, version, db, None, self._schemas_of(version, checkpoint_id))
            step = self.advance(version, checkpoint_id, self._tip.since())
            return self._tip.serve(self.location, version, step, self._options_factory)

    def advance(self, version: int, checkpoint_id: str | None, since: ViewAt | None) -> Changed | Restored:
        """`version` as the changes after `since` (the version the asker serves), when they can be
        served on it (layers.changes_since); else restored (see `restore`)."""
        with self._lock:
            self._check_order(version)
            step = changes_since(self.reader, version, checkpoint_id, since) if since is not None else None
            if step is not None:
                self.version = version
                return step
            return self.restore(version, checkpoint_id)

    def restore(self, version: int, checkpoint_id: str | None = None) -> Restored:
        """`version` restored (RocksDB backends) and left as a checkpoint directory of the local DB,
        not opened (whoever opens it removes it once done); with the version's schemas and the
        manifest id of the attempt restored."""
        with self._lock:
            self._check_order(version)
            self._opened += 1
            path, manifest_id = self.reader.checkpoint_version(version, f"v{version}-{self._opened}", checkpoint_id)
            self.version = version
            return path, self._schemas_of(version, checkpoint_id), manifest_id

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
            self._tip.close()
            self.reader.close()


__all__ = ["Follower", "OpenDB", "OpenVersion", "Restored", "StoreFollower", "Tip", "open_restored"]
