"""Versions served as a restored base plus the changes after it, held in memory (decision 0046).

Bringing a store's local DB to each new batch and leaving a checkpoint of it costs RocksDB's own
disk syncs (an ingest's, the manifest's, the checkpoint's: about 9 a store a batch), and the kernel
does their I/O on the CPU that asked for it, the answering process's; the answering process then
opens each version read-only and closes the last. Instead, a version whose chain reaches the
version a follower already serves through changelog versions only is served as that version's DB
with the changes of the versions after it on top: each version's changes read once, from the
segment the query wrote, into a dict per version. Nothing is written and nothing is opened. A
snapshot in the chain, changes deleted once snapshotted (decision 0043), a changed schema, or more
than MAX_LAYERS versions or MAX_LAYER_BYTES of changes since the base make the next version a
restore again, which starts a new base: memory stays bounded by what the query's own snapshots
leave between them."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..store import frames
from ..store.errors import CheckpointDamagedError, CheckpointMissingError

ChangeLayer = dict[bytes, bytes | None]  # a version's changes by stored key; None: deleted
MAX_LAYERS = 16  # versions served from memory before the next is restored: bounds a lookup's dict probes
MAX_LAYER_BYTES = 32 << 20  # key and value bytes held in layers of one store before the next restore
CLIENT_LAYER_BYTES = 256 << 20  # the same across every store one client follows (200 partitions, say)
ABSENT = object()


@dataclass(frozen=True)
class ViewAt:
    """The version a follower serves, as the checkpoint names it, what its layers hold, and (when
    the follower shares a LayerBudget) how many more bytes the client's layers may take."""

    version: int
    manifest_id: str
    layers: int = 0
    layer_bytes: int = 0
    budget: int | None = None

    def room(self) -> int:
        """Bytes of changes the next version may still add in layers (0: restore it instead)."""
        if self.layers >= MAX_LAYERS:
            return 0
        room = MAX_LAYER_BYTES - self.layer_bytes
        return max(0, room if self.budget is None else min(room, self.budget))


class LayerBudget:
    """The bytes of changes held in layers across the followers of one client: a follower whose
    next version would pass `limit` restores it instead, which lets go of its own layers."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = CLIENT_LAYER_BYTES if limit is None else limit
        self._held: dict[int, int] = {}
        self._lock = threading.Lock()

    def hold(self, holder: object, nbytes: int) -> None:
        """`holder` (a follower's tip) now holds `nbytes` in layers."""
        with self._lock:
            if nbytes:
                self._held[id(holder)] = nbytes
            else:
                self._held.pop(id(holder), None)

    def room(self) -> int:
        with self._lock:
            return max(0, self.limit - sum(self._held.values()))

    def held(self) -> int:
        with self._lock:
            return sum(self._held.values())


@dataclass(frozen=True)
class Changed:
    """The versions after a served one, each as its changes (oldest first), and the newest's id."""

    layers: list[tuple[int, ChangeLayer]]
    manifest_id: str
    nbytes: int


def changes_since(reader: Any, version: int, checkpoint_id: str | None, since: ViewAt) -> Changed | None:
    """The changes of the versions after `since` up to `version`, when `version`'s chain reaches
    `since` (the same attempt) through changelog versions whose changes are all still stored, none
    recording schemas of its own, within MAX_LAYERS and `since.room()`; else None: restore it.
    `reader` is the follower's StoreReader; nothing is written."""
    from ..store.backends.rocksdb import RocksDBBackend
    from ..store.backends.rocksdb.replay import segment_batches

    backend = reader.backend
    room = since.room()
    if not isinstance(backend, RocksDBBackend) or version < since.version or room == 0:
        return None
    cid = checkpoint_id if checkpoint_id is not None else reader.attempts.get(version)
    chain = []
    try:
        target = backend.read_manifest(version, cid)
        for m in backend.chain_back(target):
            if m.version == since.version:
                if m.manifest_id != since.manifest_id:
                    return None  # another attempt of the served version: not its successor
                break
            if not m.is_changelog or m.changes is None or m.key_schema or len(chain) == MAX_LAYERS - since.layers:
                return None
            chain.append(m)
        else:
            return None  # the chain starts after the served version (a rewrite, a new lineage)
        layers, nbytes = [], 0
        for m in reversed(chain):
            layer: ChangeLayer = {}
            for batch in segment_batches(backend, m):
                ops, keys, values = (batch.column(i).to_pylist() for i in range(3))
                for op, key, value in zip(ops, keys, values, strict=True):
                    layer[key] = value if op == frames.OP_PUT else None
                    nbytes += len(key) + (len(value) if value is not None else 0)
            if nbytes > room:
                return None
            layers.append((m.version, layer))
    except (CheckpointMissingError, CheckpointDamagedError):
        return None  # a restore reads it again and names what is missing or damaged
    return Changed(layers, target.manifest_id, nbytes)


def layered_get(layers: tuple[ChangeLayer, ...], key: bytes) -> Any:
    """The key's newest change in `layers` (newest first): its value, None if deleted, or ABSENT."""
    for layer in layers:
        value = layer.get(key, ABSENT)
        if value is not ABSENT:
            return value
    return ABSENT


def layered_items(
    layers: tuple[ChangeLayer, ...], base: Iterator[tuple[bytes, bytes]], prefix: bytes, after: bytes | None = None
) -> Iterator[tuple[bytes, bytes]]:
    """`base`'s (key, value) in key order with `layers` (newest first) applied: only keys starting
    with `prefix` (and, with `after`, above it; `base` starts there already), in key order."""
    changed: ChangeLayer = {}
    for layer in reversed(layers):
        changed.update((k, v) for k, v in layer.items() if k.startswith(prefix) and (after is None or k > after))
    pending = sorted(changed)
    i = 0
    for key, value in base:
        while i < len(pending) and pending[i] < key:
            if (new := changed[pending[i]]) is not None:
                yield pending[i], new
            i += 1
        if i < len(pending) and pending[i] == key:
            if (new := changed[key]) is not None:
                yield key, new
            i += 1
            continue
        yield key, value
    for k in pending[i:]:
        if (new := changed[k]) is not None:
            yield k, new


__all__ = [
    "CLIENT_LAYER_BYTES",
    "MAX_LAYERS",
    "MAX_LAYER_BYTES",
    "ChangeLayer",
    "Changed",
    "LayerBudget",
    "ViewAt",
    "changes_since",
]
