"""What the `pystatestore` command shows, as plain data: a checkpoint's metadata tree, its health,
its garbage, its disk use and its state rows. Nothing here prints or writes into a checkpoint; the
command line (cli.py) renders these, and scripts can call them directly.

The tree follows Flink's checkpoint metadata (CompletedCheckpoint → OperatorState →
OperatorSubtaskState → keyed state handle): batch → operator → partition → store → the version's
manifest.
"""

from __future__ import annotations

import datetime as dt
import decimal
import struct
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa

from ..store.errors import StateStoreError
from ..store.manifest import MANIFEST_DIR, SNAPSHOT_DIR, Manifest, checksum, manifest_path, snapshot_of
from ..store.remote import RemoteFile, join_uri
from ..store.retention import DATA_DIRS, RetentionPlan, version_of_replaced_manifest
from .checkpoint import SparkCheckpoint, StoreLocation, StoreReader, manifest_versions
from .key_lookup import KeyValueError, lookup_error, plan_lookup
from .unsafe_row import RowDecodeError, SchemaError, StateRowDecoder, unique_names

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


def store_history(reader: StoreReader, versions: Iterable[int] | None = None) -> Iterator[VersionSummary]:
    """The summary of each retained version of a store, oldest first."""
    previous: Manifest | None = None
    sizes = {f.path: f.size for f in reader.remote.list_files(MANIFEST_DIR)}
    cache: dict[int, Manifest] = {}
    for v in sorted(versions if versions is not None else reader.versions):
        m = cache.get(v) or reader.manifest(v)
        cache[v] = m
        chain = sum(1 for c in reader.backend.chain_back(m, cache) if c.is_changelog)
        if previous is not None and previous.version != v - 1:
            previous = cache.get(v - 1)
        yield summarize(m, previous, sizes.get(manifest_path(v), 0), chain)
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
                cache: dict[int, Manifest] = {}
                for summary in store_history(reader):
                    m = cache.get(summary.version) or reader.manifest(summary.version)
                    cache[summary.version] = m
                    needed = reader.backend.dependencies(m, snapshots=snapshots, now=now, cache=cache)
                    needed.add(manifest_path(m.version))
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
                size = reader.remote.fs.get_file_info(reader.remote._abs(manifest_path(version))).size or 0
                nodes.append(StoreNode(loc, version, summarize(m, previous, size, chain)))
        except StateStoreError as e:
            nodes.append(StoreNode(loc, version, None, e.problem))
    progress("reading manifests", len(ckpt.stores), len(ckpt.stores))
    return version, nodes


def tree_as_json(ckpt: SparkCheckpoint, batch: int, version: int, nodes: list[StoreNode]) -> dict[str, Any]:
    """The metadata tree: checkpoint → operators → partitions → stores → manifest."""
    operators: dict[int, dict[int, list[dict[str, Any]]]] = {}
    for n in nodes:
        entry: dict[str, Any] = {"store": n.location.store_name, "dir": n.location.uri, "version": n.version}
        if n.summary is not None:
            entry["manifest"] = {**asdict(n.summary), "uploaded_bytes": n.summary.uploaded_bytes}
        if n.problem is not None:
            entry["problem"] = n.problem
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


# -- verify ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Problem:
    store: str
    version: int | None
    file: str | None
    problem: str
    advice: str

    def __str__(self) -> str:
        where = [self.store]
        if self.version is not None:
            where.append(f"version {self.version}")
        if self.file:
            where.append(self.file)
        return f"{': '.join([', '.join(where), self.problem])}. {self.advice}"


@dataclass
class VerifyReport:
    stores: int = 0
    manifests: int = 0
    files: int = 0
    bytes_checked: int = 0
    problems: list[Problem] = field(default_factory=list)
    unreferenced: list[str] = field(default_factory=list)  # store-dir/relative path
    young_unreferenced: list[str] = field(default_factory=list)  # may be commits in flight

    @property
    def restorable(self) -> bool:
        return not self.problems


def _problem_of(e: StateStoreError) -> Problem:
    return Problem(e.store, e.version, e.file, e.problem, e.advice)


def verify_checkpoint(
    ckpt: SparkCheckpoint,
    *,
    deep: bool = False,
    grace_seconds: float = 600.0,
    progress: Progress = _no_progress,
) -> VerifyReport:
    """Every retained manifest parses, validates and belongs to its store; every file it and its
    chain need exists with its size (and, `deep`, its checksum); the last committed batch's
    version exists in every store. Files no retained version references are listed (those younger
    than `grace_seconds` apart: they may belong to a commit in flight)."""
    report = VerifyReport()
    now = time.time()
    last = ckpt.last_committed_batch
    for i, loc in enumerate(ckpt.stores):
        progress("verifying stores", i, len(ckpt.stores))
        report.stores += 1
        if loc.foreign:
            report.problems.append(
                Problem(loc.uri, None, None, f"the store holds files of {loc.foreign}", "pystatestore cannot check it.")
            )
            continue
        try:
            reader = StoreReader(loc)
        except StateStoreError as e:
            report.problems.append(_problem_of(e))
            continue
        with reader:
            _verify_store(reader, report, deep=deep, now=now, grace=grace_seconds, last_batch=last, progress=progress)
    progress("verifying stores", len(ckpt.stores), len(ckpt.stores))
    return report


def _verify_store(
    reader: StoreReader,
    report: VerifyReport,
    *,
    deep: bool,
    now: float,
    grace: float,
    last_batch: int | None,
    progress: Progress,
) -> None:
    remote = reader.remote
    listed = {f.path: f for d in DATA_DIRS for f in remote.list_files(d.rstrip("/"))}
    referenced: set[str] = set()
    if last_batch is not None and last_batch + 1 not in reader.versions:
        report.problems.append(
            Problem(
                remote.uri,
                last_batch + 1,
                manifest_path(last_batch + 1),
                f"the last committed batch ({last_batch}) needs this version, which has no manifest",
                "A restart fails here. Restore the store directory from a backup, or start from a new checkpoint "
                "location.",
            )
        )
    snapshots = {
        key: f for f in listed.values() if f.path.startswith(SNAPSHOT_DIR + "/") and (key := snapshot_of(f.path))
    }
    checked: set[str] = set()  # versions share most files: each is checked once
    cache: dict[int, Manifest] = {}
    for v in reader.versions:
        report.manifests += 1
        try:
            m = cache.get(v) or reader.manifest(v)
            cache[v] = m
            needed = reader.backend.dependencies(m, snapshots=snapshots, now=now, cache=cache)
        except StateStoreError as e:
            report.problems.append(_problem_of(e))
            continue
        refs = {r.path: r for c in reader.backend.chain_back(m, cache) for r in c.files()}
        snap = snapshots.get((m.version, m.manifest_id)) if m.is_changelog else None
        if snap is not None:
            try:
                made = reader.backend.read_snapshot(m.version, m.manifest_id)
            except StateStoreError as e:
                report.problems.append(_problem_of(e))
                made = None
            if made is not None:
                refs.update({r.path: r for r in made.files()})
        referenced |= needed | set(refs)
        for path, ref in sorted(refs.items()):
            if path in checked:
                continue
            report.files += 1
            found = listed.get(path)
            if found is None:
                report.problems.append(
                    Problem(
                        remote.uri,
                        v,
                        path,
                        "a file this version needs is missing",
                        "Restoring this version fails. Restore the file from a backup, or restart from an earlier "
                        "retained batch or a new checkpoint location.",
                    )
                )
            elif found.size != ref.size:
                report.problems.append(
                    Problem(
                        remote.uri,
                        v,
                        path,
                        f"the file has {found.size} bytes; the manifest says {ref.size} (truncated or replaced)",
                        "Restoring this version fails. Restore the file from a backup.",
                    )
                )
            elif deep:
                progress(f"checksums of {reader.location.label}", 0, 0)
                data = remote.read_bytes(path, version=v)
                report.bytes_checked += data.size
                if checksum(data) != ref.checksum:
                    report.problems.append(
                        Problem(
                            remote.uri,
                            v,
                            path,
                            f"the file's checksum is {checksum(data)}; the manifest says {ref.checksum} (damaged)",
                            "Restoring this version fails. Restore the file from a backup.",
                        )
                    )
            checked.add(path)
    for path, f in sorted(listed.items()):
        if path in referenced:
            continue
        target = report.young_unreferenced if f.mtime is None or now - f.mtime <= grace else report.unreferenced
        target.append(join_uri(remote.uri, path))


# -- gc --dry-run ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Deletion:
    store: str
    path: str
    size: int
    reason: str


def gc_dry_run(
    ckpt: SparkCheckpoint,
    *,
    min_batches_to_retain: int = 100,
    grace_seconds: float = 600.0,
    now: float | None = None,
    progress: Progress = _no_progress,
) -> list[Deletion]:
    """What the next maintenance run would delete from each store, and why; nothing is deleted.
    `min_batches_to_retain` and `grace_seconds` are the query's spark.sql.streaming.minBatchesToRetain
    and orphanGraceSeconds."""
    now = time.time() if now is None else now
    out: list[Deletion] = []
    for i, loc in enumerate(ckpt.stores):
        progress("planning garbage collection", i, len(ckpt.stores))
        if loc.foreign:
            continue
        with StoreReader(loc, retain=min_batches_to_retain, grace_seconds=grace_seconds) as reader:
            backend = reader.backend
            plan = backend.plan_maintenance(now)
            listing = {f.path: f for kind in KINDS for f in backend.remote.list_files(kind)}
            out += _explain(loc.uri, plan, listing, backend, now)
    progress("planning garbage collection", len(ckpt.stores), len(ckpt.stores))
    return out


def _explain(
    store: str, plan: RetentionPlan, listing: dict[str, RemoteFile], backend: Any, now: float
) -> list[Deletion]:
    manifests = [f for p, f in listing.items() if p.startswith(MANIFEST_DIR + "/")]
    data = [f for p, f in listing.items() if p.startswith(DATA_DIRS)]
    needs = backend.needs_by_version(manifests, data, now=now)
    users: dict[str, list[int]] = {}
    for v, refs in needs.items():
        for p in refs or ():
            users.setdefault(p, []).append(v)
    low = plan.lowest_retained
    out = []
    for p in plan.delete_manifests:
        out.append(
            Deletion(store, p, listing[p].size if p in listing else 0, f"version below the lowest retained ({low})")
        )
    for p in plan.delete_files:
        f = listing.get(p)
        size = f.size if f else 0
        age = f"{now - f.mtime:.0f} s old" if f and f.mtime is not None else "age unknown"
        if p.startswith("leases/"):
            reason = f"an expired commit lease ({age})"
        elif p.startswith(MANIFEST_DIR + "/"):
            rv = version_of_replaced_manifest(p)
            reason = f"a set-aside manifest of version {rv}, replaced" if rv is not None else f"a temporary ({age})"
        elif p in users:
            reason = f"only versions below the lowest retained ({low}) use it (last: {max(users[p])})"
        else:
            reason = f"no manifest references it and it is older than the grace ({age})"
        out.append(Deletion(store, p, size, reason))
    return out


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
def read_state(
    ckpt: SparkCheckpoint,
    *,
    operator: int = 0,
    store_name: str = "default",
    batch: int | None = None,
    partitions: Iterable[int] | None = None,
    keys: list[dict[str, Any]] | None = None,
    progress: Progress = _no_progress,
    notice: Callable[[str], None] = lambda message: None,
) -> pa.Table:
    """The state rows of `batch` (default: the last committed) of an operator's store, decoded:
    columns key, value (structs of the store's schemas) and partition_id, as
    `spark.read.format("statestore")` shows them. `keys`: only rows whose key has these fields; a
    key naming every key column is looked up in the one partition Spark sends it to (`notice`
    says whether keys were looked up or scanned for, and why)."""
    version = ckpt.version_of_batch(batch)
    wanted = set(partitions) if partitions is not None else None
    of_store = [s for s in ckpt.stores_of(operator) if s.store_name == store_name]
    locations = [s for s in of_store if wanted is None or s.partition_id in wanted]
    if not locations:
        names = sorted({(s.operator_id, s.store_name) for s in ckpt.stores})
        raise StateStoreError(
            f"the checkpoint has no store '{store_name}' of operator {operator}",
            store=ckpt.uri,
            advice=f"Its stores (operator, name): {names}. Pass --operator and --store-name.",
        )
    if keys is not None:
        with StoreReader(locations[0]) as first:
            decoder = _decoder(first, locations[0], version)
        try:
            plan = plan_lookup(ckpt, of_store, decoder.key_schema, decoder.key_encoding, keys)
        except KeyValueError as e:
            raise lookup_error(e, ckpt.uri) from None
        if plan.is_lookup:
            locations = [s for s in locations if s.partition_id in plan.by_partition]
            if not locations:  # the keys' partitions are not among those asked for
                return decoder.arrow_schema().empty_table()
            notice(
                f"looked up {len(keys)} key(s) in {len(locations)} of {len(of_store)} partitions "
                "(the ones Spark's hash partitioning sends them to)"
            )
            return _read_stores(
                locations, version, progress, lambda reader, loc: _looked_up(reader, version, plan.by_partition[loc])
            )
        notice(f"scanning every partition for the key: {plan.scan_reason}")
    return _read_stores(locations, version, progress, lambda reader, loc: reader.pairs(version), keys)


def _looked_up(reader: StoreReader, version: int, stored_keys: list[bytes]) -> Iterator[tuple[bytes, bytes]]:
    for k, v in zip(stored_keys, reader.get(version, stored_keys), strict=True):
        if v is not None:
            yield k, v


def _read_stores(
    locations: list[StoreLocation],
    version: int,
    progress: Progress,
    pairs_of: Callable[[StoreReader, int], Iterable[tuple[bytes, bytes]]],
    keys: list[dict[str, Any]] | None = None,
) -> pa.Table:
    """The decoded rows `pairs_of(reader, partition)` yields from each store, as one table."""
    tables = []
    for i, loc in enumerate(locations):
        progress("reading state", i, len(locations))
        with StoreReader(loc, progress=progress) as reader:
            decoder = _decoder(reader, loc, version)
            schema = decoder.arrow_schema()
            rows_k, rows_v = [], []
            names = unique_names(decoder.key_names)
            for k, v in pairs_of(reader, loc.partition_id):
                try:
                    key = decoder.key(k)
                    if keys is not None and not _matches(dict(zip(names, key, strict=True)), keys):
                        continue
                    value = decoder.value(v)
                except (RowDecodeError, struct.error) as e:
                    raise StateStoreError(
                        f"a state row does not decode with the schemas the manifests record ({e}; key {k[:32].hex()})",
                        store=loc.uri,
                        version=version,
                        file=manifest_path(version),
                        advice="The state was written with other schemas than the manifests say; nothing was changed. "
                        'Read it with spark.read.format("statestore").',
                    ) from None
                rows_k.append(key)
                rows_v.append(value)
            tables.append(
                pa.table(
                    {
                        "key": pa.array(rows_k, schema.field("key").type),
                        "value": pa.array(rows_v, schema.field("value").type),
                        "partition_id": pa.array([loc.partition_id] * len(rows_k), pa.int32()),
                    },
                    schema=schema,
                )
            )
    progress("reading state", len(locations), len(locations))
    return pa.concat_tables(tables)


def _decoder(reader: StoreReader, loc: StoreLocation, version: int) -> StateRowDecoder:
    try:
        return StateRowDecoder(*reader.schemas(version))
    except SchemaError as e:
        raise StateStoreError(
            f"the state cannot be decoded without Spark: {e}",
            store=loc.uri,
            version=version,
            file=manifest_path(version),
            advice='Read it with spark.read.format("statestore"). Nothing was changed.',
        ) from None


def _matches(key: dict[str, Any], wanted: list[dict[str, Any]]) -> bool:
    """Whether `key` has the fields of one of `wanted` (values as JSON gives them: dates and
    timestamps as ISO text)."""
    return any(all(f in key and _same(key[f], x) for f, x in want.items()) for want in wanted)


def _same(value: Any, given: Any) -> bool:
    if isinstance(value, (dt.date, dt.datetime)) and isinstance(given, str):
        try:
            parsed = type(value).fromisoformat(given)
        except ValueError:
            return False
        if isinstance(parsed, dt.datetime) and parsed.tzinfo is None and isinstance(value, dt.datetime):
            parsed = parsed.replace(tzinfo=value.tzinfo)
        return bool(parsed == value)
    if isinstance(value, decimal.Decimal) and isinstance(given, (int, float, str)):
        return value == decimal.Decimal(str(given))
    return bool(value == given)


def python_rows(table: pa.Table) -> list[dict[str, Any]]:
    """The table's rows as Python values, structs as dicts whose repeated field names get a
    suffix (`sum`, `sum#2`): Arrow's own to_pylist keeps only one of them."""
    columns = {
        name: _python_values(col.combine_chunks()) for name, col in zip(table.schema.names, table.columns, strict=True)
    }
    return [{name: values[i] for name, values in columns.items()} for i in range(table.num_rows)]


def _python_values(arr: pa.Array) -> list[Any]:
    t = arr.type
    if pa.types.is_struct(t):
        names = unique_names([f.name for f in t])
        children = [_python_values(arr.field(i)) for i in range(t.num_fields)]
        return [
            dict(zip(names, (c[j] for c in children), strict=True)) if arr[j].is_valid else None
            for j in range(len(arr))
        ]
    if pa.types.is_list(t):
        flat = _python_values(arr.flatten())
        offsets = arr.offsets.to_pylist()
        return [flat[offsets[j] : offsets[j + 1]] if arr[j].is_valid else None for j in range(len(arr))]
    if pa.types.is_map(t):
        keys, items = _python_values(arr.keys), _python_values(arr.items)
        offsets = arr.offsets.to_pylist()
        return [
            list(zip(keys[offsets[j] : offsets[j + 1]], items[offsets[j] : offsets[j + 1]], strict=True))
            if arr[j].is_valid
            else None
            for j in range(len(arr))
        ]
    return arr.to_pylist()


__all__ = [
    "Deletion",
    "StoreVersion",
    "checkpoint_history",
    "Problem",
    "StoreNode",
    "Usage",
    "VerifyReport",
    "VersionSummary",
    "disk_usage",
    "gc_dry_run",
    "inspect_checkpoint",
    "manifest_versions",
    "python_rows",
    "unique_names",
    "read_state",
    "store_history",
    "tree_as_json",
    "verify_checkpoint",
]
