"""What the `pystatestore` command shows, as plain data: a checkpoint's metadata tree, its
history and its disk use (verification.py: its health and garbage; state_rows.py: its rows).
Nothing here prints or writes into a checkpoint; the command line (cli.py) renders these, and
scripts can call them directly.

The tree follows Flink's checkpoint metadata (CompletedCheckpoint → OperatorState →
OperatorSubtaskState → keyed state handle): batch → operator → partition → store → the version's
manifest.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from ..reading.checkpoint import SparkCheckpoint, StoreLocation
from ..reading.families import FamilyCount, family_counts
from ..reading.store_reader import StoreReader
from ..reading.unsafe_row import RowDecodeError, SchemaError
from ..store.errors import StateStoreError
from ..store.manifest import KEY_ENCODING_FAMILIES, MANIFEST_DIR, SNAPSHOT_DIR, Manifest, snapshot_of

# Called as work advances: (what, done, total); the command line draws progress bars with it.
Progress = Callable[[str, int, int], None]


def _no_progress(what: str, done: int, total: int) -> None:
    pass


# -- inspect ---------------------------------------------------------------------------------
@dataclass
class VersionSummary:
    """One store version's manifest, summarised."""

    version: int
    kind: str  # snapshot / changelog
    backend: str
    num_keys: int
    base_version: int
    shared_files: int
    shared_bytes: int
    reused_files: int  # shared files the previous version's manifest already listed
    reused_bytes: int
    new_files: int
    new_bytes: int
    private_files: int
    private_bytes: int
    inline_files: int
    inline_bytes: int
    changelog_rows: int
    changelog_bytes: int
    changelog_inline: bool
    chain_length: int  # versions to replay on top of the nearest snapshot (0 for a snapshot)
    manifest_bytes: int
    created_at: float
    writer: dict[str, Any]
    manifest_id: str
    commit_ms: dict[str, int] = field(default_factory=dict)  # empty for manifests of older releases

    @property
    def uploaded_bytes(self) -> int:
        """What the commit wrote: new shared files, private files, changes and the manifest."""
        changes = 0 if self.changelog_inline else self.changelog_bytes
        return self.new_bytes + self.private_bytes + changes + self.manifest_bytes


def summarize(m: Manifest, previous: Manifest | None, manifest_bytes: int, chain_length: int) -> VersionSummary:
    before = {r.path for r in previous.shared.values()} if previous is not None else set()
    shared = [r for r in m.shared.values() if not r.inline]
    reused = [r for r in shared if r.path in before]
    private = [r for r in m.private.values() if not r.inline]
    inline = [r for r in (*m.shared.values(), *m.private.values()) if r.inline]
    changes = m.changes
    return VersionSummary(
        version=m.version,
        kind=m.kind,
        backend=m.backend,
        num_keys=m.num_keys,
        base_version=m.base_version,
        shared_files=len(shared),
        shared_bytes=sum(r.size for r in shared),
        reused_files=len(reused),
        reused_bytes=sum(r.size for r in reused),
        new_files=len(shared) - len(reused),
        new_bytes=sum(r.size for r in shared) - sum(r.size for r in reused),
        private_files=len(private),
        private_bytes=sum(r.size for r in private),
        inline_files=len(inline),
        inline_bytes=sum(r.size for r in inline),
        changelog_rows=changes.rows if changes else 0,
        changelog_bytes=changes.ref.size if changes else 0,
        changelog_inline=bool(changes and changes.ref.inline),
        chain_length=chain_length,
        manifest_bytes=manifest_bytes,
        created_at=m.created_at,
        writer=dict(m.writer),
        manifest_id=m.manifest_id,
        commit_ms=dict(m.commit_ms),
    )


@dataclass
class StoreNode:
    location: StoreLocation
    version: int
    summary: VersionSummary | None
    problem: str | None = None
    key_encoding: str = ""  # how the version's keys are laid out (families-v1: column families)


def store_history(reader: StoreReader, versions: Iterable[int] | None = None) -> Iterator[VersionSummary]:
    """The summary of each retained version of a store, oldest first."""
    previous: Manifest | None = None
    sizes = {f.path: f.size for f in reader.remote.list_files(MANIFEST_DIR)}
    cache: dict[str, Manifest] = {}  # by path, as chains find them
    by_version: dict[int, Manifest] = {}
    for v in sorted(versions if versions is not None else reader.versions):
        m = by_version.get(v) or reader.manifest(v)
        by_version[v] = cache[m.path] = m
        chain = sum(1 for c in reader.backend.chain_back(m, cache) if c.is_changelog)
        if previous is not None and previous.version != v - 1:
            previous = by_version.get(v - 1)
        yield summarize(m, previous, sizes.get(m.path, 0), chain)
        previous = m


@dataclass
class StoreVersion:
    """One retained version of one store, with what restoring it reads from the checkpoint."""

    location: StoreLocation
    summary: VersionSummary
    restore_bytes: int  # every file the version's chain needs, its manifests included
    restore_files: int


def checkpoint_history(ckpt: SparkCheckpoint, progress: Progress = _no_progress) -> list[StoreVersion]:
    """Every retained version of every store (what the report plots)."""
    out: list[StoreVersion] = []
    now = time.time()
    for i, loc in enumerate(ckpt.stores):
        progress("reading store histories", i, len(ckpt.stores))
        if loc.foreign:
            continue
        try:
            with StoreReader(loc) as reader:
                listing = {f.path: f for kind in KINDS for f in reader.remote.list_files(kind)}
                snapshots = {
                    key: f for p, f in listing.items() if p.startswith(SNAPSHOT_DIR + "/") and (key := snapshot_of(p))
                }
                cache: dict[str, Manifest] = {}
                for summary in store_history(reader):
                    m = reader.manifest(summary.version)
                    cache[m.path] = m
                    needed = reader.backend.dependencies(m, snapshots=snapshots, now=now, cache=cache)
                    needed.add(m.path)
                    sizes = [listing[p].size for p in needed if p in listing]
                    out.append(StoreVersion(loc, summary, sum(sizes), len(sizes)))
        except StateStoreError:
            continue  # verify names what is wrong; the history shows what can be read
    progress("reading store histories", len(ckpt.stores), len(ckpt.stores))
    return out


def inspect_checkpoint(
    ckpt: SparkCheckpoint, batch: int | None = None, progress: Progress = _no_progress
) -> tuple[int, list[StoreNode]]:
    """The version of `batch` (default: the last committed) and each store's manifest of it."""
    version = ckpt.version_of_batch(batch)
    nodes = []
    for i, loc in enumerate(ckpt.stores):
        progress("reading manifests", i, len(ckpt.stores))
        if loc.foreign:
            nodes.append(StoreNode(loc, version, None, f"written by {loc.foreign}"))
            continue
        try:
            with StoreReader(loc) as reader:
                m = reader.manifest(version)
                previous = reader.manifest(version - 1) if version - 1 in reader.versions else None
                chain = sum(1 for c in reader.backend.chain_back(m) if c.is_changelog)
                size = reader.remote.fs.get_file_info(reader.remote._abs(m.path)).size or 0
                encoding = reader.schemas(version)[2]
                nodes.append(StoreNode(loc, version, summarize(m, previous, size, chain), key_encoding=encoding))
        except StateStoreError as e:
            nodes.append(StoreNode(loc, version, None, e.problem))
    progress("reading manifests", len(ckpt.stores), len(ckpt.stores))
    return version, nodes


def has_families(node: StoreNode) -> bool:
    """Whether the store keeps column families (a transformWithState store), as its manifest says."""
    return node.summary is not None and node.key_encoding == KEY_ENCODING_FAMILIES


def store_families(
    nodes: list[StoreNode], progress: Progress = _no_progress
) -> dict[StoreLocation, list[FamilyCount] | str]:
    """Per store with column families: keys, values and bytes of each family at the node's version
    (its whole state is read), or what kept it from being read."""
    wanted = [n for n in nodes if has_families(n)]
    out: dict[StoreLocation, list[FamilyCount] | str] = {}
    for i, n in enumerate(wanted):
        progress("counting column families", i, len(wanted))
        try:
            with StoreReader(n.location) as reader:
                out[n.location] = family_counts(reader.state_pairs(n.version))
        except (StateStoreError, RowDecodeError, SchemaError) as e:
            out[n.location] = getattr(e, "problem", None) or str(e)
    progress("counting column families", len(wanted), len(wanted))
    return out


def _family_json(counts: list[FamilyCount] | str) -> list[dict[str, Any]] | dict[str, str]:
    if isinstance(counts, str):
        return {"problem": counts}
    return [
        {
            "name": c.family.name,
            "id": c.family.family_id,
            "key_encoding": c.family.key_encoding,
            "multiple_values": c.family.multiple_values,
            "keys": c.keys,
            "values": c.values,
            "key_bytes": c.key_bytes,
            "value_bytes": c.value_bytes,
        }
        for c in counts
    ]


def tree_as_json(
    ckpt: SparkCheckpoint,
    batch: int,
    version: int,
    nodes: list[StoreNode],
    families: dict[StoreLocation, list[FamilyCount] | str] | None = None,
) -> dict[str, Any]:
    """The metadata tree: checkpoint → operators → partitions → stores → manifest (and, where
    `families` has the store, its column families)."""
    operators: dict[int, dict[int, list[dict[str, Any]]]] = {}
    for n in nodes:
        entry: dict[str, Any] = {"store": n.location.store_name, "dir": n.location.uri, "version": n.version}
        if n.summary is not None:
            entry["manifest"] = {**asdict(n.summary), "uploaded_bytes": n.summary.uploaded_bytes}
        if n.problem is not None:
            entry["problem"] = n.problem
        if families is not None and n.location in families:
            entry["families"] = _family_json(families[n.location])
        operators.setdefault(n.location.operator_id, {}).setdefault(n.location.partition_id, []).append(entry)
    return {
        "checkpoint": ckpt.uri,
        "query_id": ckpt.query_id,
        "provider": ckpt.provider,
        "batch": batch,
        "version": version,
        "committed_batches": ckpt.committed_batches,
        "operators": [
            {
                "operator_id": op,
                "partitions": [{"partition_id": p, "stores": stores} for p, stores in sorted(parts.items())],
            }
            for op, parts in sorted(operators.items())
        ],
    }


# -- du --------------------------------------------------------------------------------------
# A store's directories; anything else in a store directory is no store's and is left alone.
KINDS = ("manifests", "shared", "private", "changelog", "snapshots", "leases")


@dataclass
class Usage:
    operator_id: int
    partition_id: int
    store_name: str
    files: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())

    @property
    def total_files(self) -> int:
        return sum(self.files.values())


def disk_usage(ckpt: SparkCheckpoint, progress: Progress = _no_progress) -> list[Usage]:
    """Bytes and files of each store by kind (what `du` shows)."""
    from ..store.remote import RemoteStore

    out = []
    for i, loc in enumerate(ckpt.stores):
        progress("listing stores", i, len(ckpt.stores))
        u = Usage(loc.operator_id, loc.partition_id, loc.store_name)
        remote = RemoteStore(loc.uri)
        for kind in KINDS:
            for f in remote.list_files(kind):
                u.files[kind] += 1
                u.bytes[kind] += f.size
        out.append(u)
    progress("listing stores", len(ckpt.stores), len(ckpt.stores))
    return out


# -- read ------------------------------------------------------------------------------------


__all__ = [
    "KINDS",
    "Progress",
    "StoreNode",
    "StoreVersion",
    "Usage",
    "VersionSummary",
    "checkpoint_history",
    "disk_usage",
    "inspect_checkpoint",
    "store_history",
    "tree_as_json",
]
