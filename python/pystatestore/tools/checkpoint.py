"""A Spark streaming checkpoint as the tools see it, read without Spark or a JVM.

Spark's layout: `metadata` (the query id), `offsets/<batch>` (each planned batch, with the SQL
confs the query runs with), `commits/<batch>` (each finished batch) and `state/<operator>/
<partition>[/<store name>]/`, one directory per state store. pystatestore's stores hold
`manifests/<version>.json` (checkpoint format v2: `manifests/<version>-<id>.json`, one per attempt,
the commit log naming each batch's); the state of batch b is version b + 1. This module finds the batches,
operators, partitions and stores, and opens a store's backend read-only: the tools read manifests
and restore versions into scratch space of their own, and write nothing into the checkpoint.
"""

from __future__ import annotations

import json
import posixpath
import re
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow._fs as pafs
import pyarrow.compute as pc

from ..store import frames
from ..store.backends import BACKENDS, StateBackend, StoreContext
from ..store.errors import CheckpointDamagedError, CheckpointMissingError, StoreConfigError
from ..store.manifest import MANIFEST_DIR, Manifest, manifest_path, version_of_manifest
from ..store.remote import RemoteStore, describe_foreign_layout, filesystem_for, join_uri

DEFAULT_STORE_NAME = "default"
OUR_PROVIDER = "org.pystatestore.PythonStateStoreProvider"
_NUMBER = re.compile(r"^\d+$")


@dataclass(frozen=True)
class StoreLocation:
    """One state store of the checkpoint: an operator's partition's store (joins have four)."""

    operator_id: int
    partition_id: int
    store_name: str
    uri: str  # the store directory, as Spark names it (file:/..., s3a://...)
    foreign: str | None = None  # another provider's files found here instead of manifests
    # Checkpoint format v2: (version, checkpoint id) of each committed batch's attempt, from the commit log.
    attempts: tuple[tuple[int, str], ...] = ()

    @property
    def label(self) -> str:
        name = "" if self.store_name == DEFAULT_STORE_NAME else f"/{self.store_name}"
        return f"operator {self.operator_id} partition {self.partition_id}{name}"


@dataclass
class SparkCheckpoint:
    """The query-level part of a checkpoint: its batches and its state stores."""

    uri: str
    query_id: str | None
    planned_batches: list[int]  # offsets/
    committed_batches: list[int]  # commits/
    conf: dict[str, str] = field(default_factory=dict)  # the SQL confs of the last planned batch
    stores: list[StoreLocation] = field(default_factory=list)

    @property
    def last_committed_batch(self) -> int | None:
        return self.committed_batches[-1] if self.committed_batches else None

    @property
    def committed_span(self) -> str:
        """The committed batches as `first..last` (or `none`)."""
        return _ranges(self.committed_batches)

    @property
    def provider(self) -> str | None:
        return self.conf.get("spark.sql.streaming.stateStore.providerClass")

    def operators(self) -> list[int]:
        return sorted({s.operator_id for s in self.stores})

    def stores_of(self, operator: int | None = None) -> list[StoreLocation]:
        return [s for s in self.stores if operator is None or s.operator_id == operator]

    def version_of_batch(self, batch: int | None) -> int:
        """The store version holding the state after `batch` (default: the last committed one)."""
        if batch is None:
            batch = self.last_committed_batch
            if batch is None:
                raise CheckpointMissingError(
                    "the query has not committed a batch yet: there is no state to read",
                    store=self.uri,
                    file="commits/",
                )
        elif batch not in self.committed_batches:
            raise CheckpointMissingError(
                f"batch {batch} is not in the commit log (committed: {_ranges(self.committed_batches)})",
                store=self.uri,
                file=f"commits/{batch}",
                advice="Pick a committed batch; Spark keeps the last spark.sql.streaming.minBatchesToRetain.",
            )
        return batch + 1


def _ranges(numbers: list[int]) -> str:
    if not numbers:
        return "none"
    return f"{numbers[0]}..{numbers[-1]}" if len(numbers) > 1 else str(numbers[0])


def _child_names(fs: pafs.FileSystem, path: str, kind: pafs.FileType) -> list[str]:
    infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    return sorted(posixpath.basename(i.path) for i in infos if i.type == kind)


def _read_text(fs: pafs.FileSystem, path: str) -> str | None:
    try:
        with fs.open_input_stream(path) as f:
            return f.read().decode("utf-8", errors="replace")
    except (FileNotFoundError, OSError):
        return None


def open_checkpoint(uri: str) -> SparkCheckpoint:
    """Reads a checkpoint's layout. `uri` is what the query's `checkpointLocation` was: a local
    path, `file:`, or anything `pyarrow.fs` opens (s3://, gs://, hdfs://)."""
    if "://" not in uri and not uri.startswith("file:"):
        uri = "file:" + str(Path(uri).resolve())
    fs, root = filesystem_for(uri)
    if fs.get_file_info(root).type != pafs.FileType.Directory:
        raise CheckpointMissingError("there is no checkpoint directory here", store=uri)
    names = set(_child_names(fs, root, pafs.FileType.Directory))
    if not names & {"offsets", "commits", "state"}:
        raise StoreConfigError(
            "this directory is not a Spark streaming checkpoint (it has no offsets/, commits/ or state/)",
            store=uri,
            advice="Pass the query's checkpointLocation, the directory that holds offsets/, commits/ and state/.",
        )
    metadata = _read_text(fs, posixpath.join(root, "metadata"))
    query_id = None
    if metadata:
        try:
            query_id = json.loads(metadata.splitlines()[0]).get("id")
        except (json.JSONDecodeError, IndexError, AttributeError):
            query_id = None

    def batches(d: str) -> list[int]:
        return sorted(int(n) for n in _child_names(fs, posixpath.join(root, d), pafs.FileType.File) if _NUMBER.match(n))

    planned, committed = batches("offsets"), batches("commits")
    conf: dict[str, str] = {}
    if planned:
        text = _read_text(fs, posixpath.join(root, "offsets", str(planned[-1]))) or ""
        lines = text.splitlines()
        try:
            conf = {str(k): str(v) for k, v in json.loads(lines[1]).get("conf", {}).items()}
        except (json.JSONDecodeError, IndexError, AttributeError):
            conf = {}
    ckpt = SparkCheckpoint(uri=uri, query_id=query_id, planned_batches=planned, committed_batches=committed, conf=conf)
    attempts = _commit_log_attempts(fs, root, committed)
    state = posixpath.join(root, "state")
    for op in _child_names(fs, state, pafs.FileType.Directory):
        if not _NUMBER.match(op):
            continue  # _metadata, _stateSchema
        for part in _child_names(fs, posixpath.join(state, op), pafs.FileType.Directory):
            if not _NUMBER.match(part):
                continue
            part_dir = posixpath.join(state, op, part)
            children = _child_names(fs, part_dir, pafs.FileType.Directory)
            found = []
            if MANIFEST_DIR in children or not any(_is_store(fs, posixpath.join(part_dir, c)) for c in children):
                found.append((DEFAULT_STORE_NAME, join_uri(uri, "state", op, part)))
            found += [
                (c, join_uri(uri, "state", op, part, c)) for c in children if _is_store(fs, posixpath.join(part_dir, c))
            ]
            for name, store_uri in found:
                remote = RemoteStore(store_uri)
                foreign = None if remote.exists(MANIFEST_DIR) else describe_foreign_layout(remote)
                named = tuple(attempts.get((int(op), int(part), name), ()))
                ckpt.stores.append(StoreLocation(int(op), int(part), name, store_uri, foreign, named))
    ckpt.stores.sort(key=lambda s: (s.operator_id, s.partition_id, s.store_name))
    return ckpt


# The order of a stream-stream join's stores in Spark's commit log (SymmetricHashJoinStateManager).
JOIN_STORE_NAMES = (
    "left-keyToNumValues",
    "left-keyWithIndexToValue",
    "right-keyToNumValues",
    "right-keyWithIndexToValue",
)


def _commit_log_attempts(
    fs: pafs.FileSystem, root: str, committed: list[int]
) -> dict[tuple[int, int, str], list[tuple[int, str]]]:
    """(operator, partition, store name) -> [(version, checkpoint id)] from the commit log of a query
    run with checkpoint format v2 (`stateUniqueIds`); empty for format v1."""
    found: dict[tuple[int, int, str], list[tuple[int, str]]] = {}
    for batch in committed:
        text = _read_text(fs, posixpath.join(root, "commits", str(batch))) or ""
        lines = text.splitlines()
        try:
            ids = json.loads(lines[1]).get("stateUniqueIds") if len(lines) > 1 else None
        except (json.JSONDecodeError, AttributeError):
            ids = None
        if not isinstance(ids, dict):
            continue
        for op, partitions in ids.items():
            for partition, names in enumerate(partitions or []):
                stores = JOIN_STORE_NAMES if len(names) == len(JOIN_STORE_NAMES) else (DEFAULT_STORE_NAME,)
                for name, cid in zip(stores, names, strict=False):
                    found.setdefault((int(op), partition, name), []).append((batch + 1, str(cid)))
    return found


def _is_store(fs: pafs.FileSystem, path: str) -> bool:
    return MANIFEST_DIR in _child_names(fs, path, pafs.FileType.Directory)


def manifest_versions(remote: RemoteStore) -> list[int]:
    """The versions with a published manifest."""
    return sorted(
        {
            v
            for f in remote.list_files(MANIFEST_DIR)
            if "/." not in f.path and (v := version_of_manifest(f.path)) is not None
        }
    )


def read_manifest_file(remote: RemoteStore, version: int) -> Manifest:
    """A manifest of `version`: its only one, or (checkpoint format v2) one of its attempts'."""
    rel = manifest_path(version)
    if not remote.exists(rel):
        attempts = [f.path for f in remote.list_files(MANIFEST_DIR) if version_of_manifest(f.path) == version]
        rel = min((p for p in attempts if "/." not in p), default=rel)
    data = remote.read_bytes(rel, version=version).to_pybytes()
    return Manifest.from_json(data, store=remote.uri, version=version, file=rel)


def _binary_array(items: list[bytes]) -> pa.Array:
    """`items` as one Arrow binary array, built from their concatenation: pa.array() of a list of
    bytes costs about 2 us an item, a million keys 2 s."""
    lengths = np.fromiter(map(len, items), np.int64, len(items))
    offsets = np.zeros(len(items) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    large = offsets[-1] >= 2**31
    return pa.Array.from_buffers(
        pa.large_binary() if large else pa.binary(),
        len(items),
        [None, pa.py_buffer(offsets if large else offsets.astype(np.int32)), pa.py_buffer(b"".join(items))],
    )


class StoreReader:
    """A store's backend opened for reading, as a worker would open it (its identity from its
    manifests), with its scratch space in a temporary directory of its own. Local recovery is off,
    so nothing on this host is read in place of the checkpoint's files, and no commit, lease or
    maintenance is ever started: the checkpoint is only read."""

    def __init__(
        self,
        location: StoreLocation,
        scratch: str | None = None,
        *,
        retain: int | None = None,
        grace_seconds: float = 600.0,
        progress: Callable[[str, int, int], None] | None = None,
    ) -> None:
        """`retain` and `grace_seconds`: the query's minBatchesToRetain and orphanGraceSeconds, which
        only planning garbage collection uses (default: every version is retained). `progress`
        (what, done, total) hears the bytes a restore downloads."""
        self.location = location
        self._progress = progress
        self.remote = RemoteStore(location.uri)
        if location.foreign:
            raise StoreConfigError(
                f"this store holds state written by {location.foreign}, which pystatestore does not read",
                store=location.uri,
                advice='Read it with Spark: spark.read.format("statestore").load(checkpointLocation).',
            )
        versions = manifest_versions(self.remote)
        if not versions:
            raise CheckpointMissingError("the store has no manifests: nothing was committed", store=location.uri)
        self.versions = versions
        self.attempts = dict(location.attempts)
        self._manifests: dict[int, Manifest] = {}
        first = self._identity_manifest(versions)
        if first.backend not in BACKENDS:
            raise StoreConfigError(f"the store was written by an unknown backend {first.backend!r}", store=location.uri)
        self._scratch = tempfile.TemporaryDirectory(prefix="pystatestore-read-", dir=scratch)
        ctx = StoreContext(
            store_dir=location.uri,
            operator_id=int(first.store["operatorId"]),
            partition_id=int(first.store["partitionId"]),
            store_name=str(first.store["storeName"]),
            key_schema=first.key_schema,
            value_schema=first.value_schema,
            min_versions_to_retain=retain if retain is not None else len(versions),
            orphan_grace_seconds=grace_seconds,
            local_dir=self._scratch.name,
            options={"localRecovery": "false"},
            key_encoding=first.key_encoding,
            views_dir=self._scratch.name,
            checkpoint_ids=first.checkpoint_id is not None,
        )
        self.backend: StateBackend = BACKENDS[first.backend](ctx, self.remote)

    def _identity_manifest(self, versions: list[int]) -> Manifest:
        """A manifest that carries the schemas (snapshots and the first of a changelog chain do)."""
        first: Manifest | None = None
        for v in reversed(versions):
            m = read_manifest_file(self.remote, v)
            first = first or m
            if m.key_schema:
                return m
        assert first is not None
        return first

    def manifest(self, version: int) -> Manifest:
        """The manifest of `version`: under checkpoint format v2, of the attempt the commit log names."""
        m = self._manifests.get(version)
        if m is None:
            m = self._manifests[version] = self.backend.read_manifest(version, self.attempts.get(version))
        return m

    def schemas(self, version: int) -> tuple[str, str, str]:
        """(key schema, value schema, key encoding) of `version`: from the nearest manifest of its
        chain that records them, else from the store's other manifests."""
        for m in self.backend.chain_back(self.manifest(version)):
            if m.key_schema:
                return m.key_schema, m.value_schema, m.key_encoding
        ctx = self.backend.ctx
        return ctx.key_schema, ctx.value_schema, ctx.key_encoding

    def pairs(self, version: int) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) of `version`, in key order, restored into this reader's scratch space."""
        with self._restored(version) as state:
            if isinstance(state, dict):
                yield from sorted(state.items())
            else:
                yield from state.items()

    def state_pairs(self, version: int) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) of `version` in key order, as `state_table` reads them."""
        state = self.state_table(version)
        return zip(state.column("key").to_pylist(), state.column("value").to_pylist(), strict=True)

    def state_table(self, version: int) -> pa.Table:
        """Every (key, value) of `version` as one table in key order: from its changelog segments
        where they hold it all, else restored (see `pairs`)."""
        chain = self._segment_chain(version)
        if chain is not None:
            with self._download_progress(version):
                return self._state_from_segments(version, chain)
        pairs = list(self.pairs(version))
        return pa.table(
            [_binary_array([k for k, _ in pairs]), _binary_array([v for _, v in pairs])], names=["key", "value"]
        )

    def _segment_chain(self, version: int) -> list[Manifest] | None:
        """`version`'s chain, newest first, when its changelog segments hold its whole state: every
        change back to version 1 or to a compact snapshot's segment. None when the chain starts at a
        snapshot of SST files or its older part is gone: restore those."""
        from ..store.backends.rocksdb import RocksDBBackend

        backend = self.backend
        if not isinstance(backend, RocksDBBackend):
            return None
        try:
            chain = list(backend.chain_back(self.manifest(version)))
        except CheckpointMissingError:
            return None
        return chain if all(m.changes is not None for m in chain) else None

    def _state_from_segments(self, version: int, chain: list[Manifest]) -> pa.Table:
        """The state `chain`'s segments hold, built without a local DB (a rewrite reads hundreds
        of stores once each): each key's newest change, oldest version first, as a restore's
        replay applies them (replay.newest_change_per_key), deletes dropped."""
        from ..store.backends.rocksdb import RocksDBBackend
        from ..store.backends.rocksdb.replay import newest_change_per_key, segment_batches

        backend = self.backend
        assert isinstance(backend, RocksDBBackend)
        tables = [
            pa.Table.from_batches(list(segment_batches(backend, m)), frames.CHANGES_SCHEMA) for m in reversed(chain)
        ]
        state = newest_change_per_key(tables)
        state = state.filter(pc.equal(state.column("op"), frames.OP_PUT)).select(["key", "value"])
        if state.num_rows != chain[0].num_keys:
            raise CheckpointDamagedError(
                f"version {version}'s changes leave {state.num_rows} keys, but its manifest records "
                f"{chain[0].num_keys}",
                store=self.location.uri,
                version=version,
                file=chain[0].path,
            )
        return state

    def get(self, version: int, stored_keys: list[bytes]) -> list[bytes | None]:
        """The values of `stored_keys` in `version` (None where a key is absent): point reads of
        the restored version, no scan."""
        with self._restored(version) as state:
            return [state.get(k) for k in stored_keys]

    def restore_bytes(self, version: int) -> int:
        """The bytes of the checkpoint's files that restoring `version` reads: the files each
        manifest of its chain names, back to its snapshot."""
        sizes = {r.path: r.size for m in self.backend.chain_back(self.manifest(version)) for r in m.files()}
        return sum(sizes.values())

    @contextmanager
    def _restored(self, version: int) -> Iterator[Any]:
        """`version` restored (see `_load`), closed afterwards."""
        with self._download_progress(version):
            state = self._load(version)
        try:
            yield state
        finally:
            if not isinstance(state, dict):
                state.close()

    @contextmanager
    def _download_progress(self, version: int) -> Iterator[None]:
        """Reports the bytes downloaded while restoring `version` (a bar per store on a terminal)."""
        progress = self._progress
        total = self.restore_bytes(version) if progress is not None else 0
        if progress is None or total == 0:  # small changelog stores can be all inline: nothing to fetch
            yield
            return
        what = "downloading"  # one bar, for the store being read (a bar per store would be 200 rows)
        lock = threading.Lock()
        moved = 0

        def observe(point: str, n: int) -> None:
            nonlocal moved
            if point == "download:chunk":
                with lock:  # the backend downloads on several threads
                    moved += n
                    done = moved
                progress(what, done, total)

        progress(what, 0, total)
        self.backend.transfer_observer = observe
        try:
            yield
        finally:
            self.backend.transfer_observer = None
        progress(what, max(moved, total), max(moved, total))

    def _load(self, version: int) -> Any:
        """`version` restored: a dict for frame backends, else its RocksDB opened read-only."""
        import rocksdict

        from ..store import frames

        if self.backend.read_path == "frame":
            result = self.backend.load(version, None, self.attempts.get(version))
            assert result.frame is not None
            return frames.buffer_to_state(result.frame)
        view = Path(self._scratch.name) / f"view-{version}"
        self.backend.load(version, str(view), self.attempts.get(version))
        opts = rocksdict.Options(raw_mode=True)
        opts.create_if_missing(False)
        return rocksdict.Rdict(str(view), opts, access_type=rocksdict.AccessType.read_only())

    def close(self) -> None:
        try:
            self.backend.close()
        finally:
            self._scratch.cleanup()

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
