"""A store of a checkpoint (checkpoint.py's StoreLocation) opened for reading, without Spark or a
JVM: its manifests, and its versions restored into scratch space of the reader's own. Nothing is
written into the checkpoint.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..store import frames
from ..store.backends import BACKENDS, StateBackend, StoreContext
from ..store.errors import CheckpointDamagedError, CheckpointMissingError, StoreConfigError
from ..store.manifest import MANIFEST_DIR, SNAPSHOT_DIR, Manifest, manifest_path, snapshot_of, version_of_manifest
from ..store.remote import RemoteStore
from .checkpoint import StoreLocation


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
        snapshots: set[tuple[int, str]] | None = None
        for m in self.backend.chain_back(self.manifest(version)):
            if m.key_schema:
                return m.key_schema, m.value_schema, m.key_encoding
            if snapshots is None:
                snapshots = {key for f in self.remote.list_files(SNAPSHOT_DIR) if (key := snapshot_of(f.path))}
            if (m.version, m.manifest_id) in snapshots:
                # A snapshot maintenance made records them, and GC may have taken the chain before it.
                made = self.backend.read_snapshot(m.version, m.manifest_id)
                if made is not None and made.key_schema:
                    return made.key_schema, made.value_schema, made.key_encoding
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
            try:
                with self._download_progress(version):
                    return self._state_from_segments(version, chain)
            except CheckpointMissingError:
                pass  # a version's changes went once it had a snapshot (decision 0043): restore instead
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
        return self.open_version(version, f"view-{version}")

    def open_version(self, version: int, name: str, checkpoint_id: str | None = None, options: Any = None) -> Any:
        """`version` (under checkpoint format v2: the attempt `checkpoint_id`, else the one the commit
        log names) restored: a dict for frame backends, else a RocksDB checkpoint of this reader's
        local DB at scratch directory `name` (new), opened read-only with `options` (rocksdict
        Options; default: raw mode). The local DB moves forward by replaying what each newer version
        changed, so reading versions in order restores each one's changes only."""
        from ..store import frames

        if self.reads_frames:
            cid = checkpoint_id if checkpoint_id is not None else self.attempts.get(version)
            result = self.backend.load(version, None, cid)
            assert result.frame is not None
            return frames.buffer_to_state(result.frame)
        return open_read_only(self.checkpoint_version(version, name, checkpoint_id)[0], options)

    @property
    def reads_frames(self) -> bool:
        """Whether the store's backend restores to an in-memory frame (no RocksDB to checkpoint)."""
        return self.backend.read_path == "frame"

    def checkpoint_version(self, version: int, name: str, checkpoint_id: str | None = None) -> tuple[Path, str]:
        """`version` restored into this reader's local DB (RocksDB backends), left as a checkpoint of
        it at scratch directory `name` (new), not opened: another process may open it. With the
        manifest id of the attempt restored."""
        cid = checkpoint_id if checkpoint_id is not None else self.attempts.get(version)
        view = self.scratch_dir / name
        loaded = self.backend.load(version, str(view), cid)
        return view, loaded.manifest_id

    @property
    def scratch_dir(self) -> Path:
        """This reader's own scratch space (removed on close)."""
        return Path(self._scratch.name)

    def close(self) -> None:
        try:
            self.backend.close()
        finally:
            self._scratch.cleanup()

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def open_read_only(path: Path, options: Any = None) -> Any:
    """A RocksDB checkpoint directory opened read-only, with `options` (rocksdict Options; default:
    raw mode)."""
    import rocksdict

    opts = options if options is not None else rocksdict.Options(raw_mode=True)
    opts.create_if_missing(False)
    return rocksdict.Rdict(str(path), opts, access_type=rocksdict.AccessType.read_only())
