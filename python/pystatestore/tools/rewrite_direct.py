"""The direct route of a rewrite: its pystatestore stores written in Python, with no JVM; and
`repartition` of a pystatestore checkpoint without Spark.

Where the target is pystatestore, its stores are written by the same backend code a worker runs,
as the one version after the new batch; no provider is opened in a JVM. The source state comes
from where it lives: where both ends are this package's format, from the source store's files
(changelog segments as Arrow where they hold the whole state, else restored as a worker would), so
nothing needs a JVM; where the source is Spark's provider, from Spark's state reader, each source
store exported by the shim (`StateRewrite.export`, rewrite_spark.py) as the stored key and value
bytes. Every stored key is placed by Spark's hash computed on its UnsafeRow bytes
(`spark_hash.stored_key_hashes`). Placed keys wait on disk (a file per source store, ordered by
target partition), so one store's state at a time is in memory, as in a Spark task. Every key must
sit where the hash puts it for the source partition count (the proof that the hash and the key
columns are Spark's, on this very data), and every store written is read back from its files and
compared before the checkpoint is published. See docs/decisions/0026-state-rewrite.md.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa

from ..reading.checkpoint import StoreLocation
from ..reading.spark_hash import stored_key_hashes
from ..reading.store_reader import StoreReader
from ..reading.unsafe_row import RowDecodeError, SchemaError, parse_schema
from ..spark_minors import CONF_PREFIX
from ..store import frames, local_disk
from ..store.backends import BACKENDS, DEFAULT_BACKEND, StoreContext
from ..store.leases import DEFAULT_ORPHAN_GRACE_SECONDS
from ..store.manifest import KEY_ENCODING_PREFIX, KEY_ENCODING_RAW
from ..store.remote import RemoteStore
from .rewrite_plan import SCRATCH_DIR, Progress, RewriteError, RewritePlan, StoreKind, StoreResult, store_dir


def store_options(conf: dict[str, str]) -> dict[str, str]:
    """The worker options a store opened under `conf` gets (its pystatestore confs, prefix
    stripped), as the shim passes them. A rewrite's stores keep no local recovery copies: the query
    restarted on the result may run on another host."""
    options = {k[len(CONF_PREFIX) :]: v for k, v in conf.items() if k.startswith(CONF_PREFIX)}
    return {**options, "localRecovery": "false"}


def stored_key_encoding(kind: StoreKind, conf: dict[str, str]) -> str:
    """How the shim stores this kind's keys under `conf`: the prefix row first where the store is
    prefix-scanned and read through views (every backend but memory), else the row alone
    (Provider.scala: keyCodec)."""
    backend = store_options(conf).get("backend", DEFAULT_BACKEND)
    return KEY_ENCODING_PREFIX if kind.num_cols_prefix_key > 0 and backend != "memory" else KEY_ENCODING_RAW


def _location(root: str, kind: StoreKind, partition: int) -> StoreLocation:
    return StoreLocation(
        kind.operator_id, partition, kind.store_name, f"file:{store_dir(Path(root) / 'state', kind, partition)}"
    )


@dataclass
class _Placed:
    """The keys of every source store of a kind, each store's in one file ordered by target
    partition (`bounds[p][t]`: where target t's rows start in source p's file): a state larger
    than memory is held on disk, and only one target store at a time in memory."""

    files: list[Path]
    bounds: list[np.ndarray]
    schemas: tuple[str, str, str]  # key schema, value schema, key encoding
    _tables: dict[Path, pa.Table] = field(default_factory=dict)

    def target_state(self, target: int) -> pa.Table:
        """Target partition `target`'s state, in key order."""
        slices = []
        for path, bounds in zip(self.files, self.bounds, strict=True):
            start, end = int(bounds[target]), int(bounds[target + 1])
            if end > start:
                if path not in self._tables:  # memory-mapped: the page cache holds it, not the heap
                    self._tables[path] = pa.ipc.open_file(pa.memory_map(str(path))).read_all()
                slices.append(self._tables[path].slice(start, end - start))
        if not slices:
            return frames.STATE_SCHEMA.empty_table()
        return pa.concat_tables(slices).sort_by([("key", "ascending")])


@dataclass
class Source:
    """Where the source state of a store kind comes from: `state(p)` is source partition p's state
    (stored key and value bytes), `schemas` the key schema, value schema and key encoding of those
    bytes."""

    state: Callable[[int], pa.Table]
    schemas: tuple[str, str, str]


def our_source(plan: RewritePlan, kind: StoreKind, work: Path) -> Source:
    """The state of `kind`'s stores read from their files: the source is pystatestore."""
    version = plan.read_batch + 1

    def state(p: int) -> pa.Table:
        with StoreReader(_location(str(plan.source), kind, p)) as reader:
            return reader.state_table(version)

    with StoreReader(_location(str(plan.source), kind, 0)) as reader:
        return Source(state, reader.schemas(version))


def _placed(plan: RewritePlan, kind: StoreKind, source: Source, work: Path, progress: Progress) -> _Placed:
    """Every key of the source stores of `kind`, ordered by the target partition Spark's hash gives
    it, one file per source store under `work`."""
    schemas = source.schemas
    key_type = parse_schema(schemas[0])
    hashed_fields = kind.hashed_key_fields(len(key_type.fields))
    # With the partition count unchanged (a migration) every key stays where Spark put it: no rule
    # is needed, so none is applied and none can refuse a key type.
    same_partitions = plan.target_partitions == plan.source_partitions
    files: list[Path] = []
    all_bounds: list[np.ndarray] = []
    misplaced = 0
    for p in range(plan.source_partitions):
        progress(f"reading {kind.label}", p, plan.source_partitions)
        state = source.state(p)
        if same_partitions:
            target = np.full(state.num_rows, p, np.int64)
        else:
            try:
                h = stored_key_hashes(key_type, state.column("key"), schemas[2], hashed_fields).astype(np.int64)
            except (SchemaError, RowDecodeError) as e:
                raise RewriteError(
                    f"the keys of {kind.label} cannot be placed without Spark: {e}",
                    store=str(plan.source),
                    file=f"state/{kind.operator_id}/{p}",
                    advice="The output is left unfinished; delete it. Keep the partition count, or report the key "
                    "type so its hash can be added.",
                ) from None
            misplaced += int(np.count_nonzero(h % plan.source_partitions != p))
            target = h % plan.target_partitions
        order = np.argsort(target, kind="stable")
        all_bounds.append(np.searchsorted(target[order], np.arange(plan.target_partitions + 1)))
        ordered = state.take(pa.array(order))
        if ordered.schema != frames.STATE_SCHEMA:
            ordered = ordered.cast(frames.STATE_SCHEMA)
        files.append(work / f"placed-{p}.arrow")
        with pa.ipc.new_file(str(files[-1]), frames.STATE_SCHEMA) as out:
            out.write_table(ordered)
    progress(f"reading {kind.label}", plan.source_partitions, plan.source_partitions)
    if misplaced:
        raise RewriteError(
            f"{misplaced} keys of {kind.label} are not in the partition Spark's hash of {hashed_fields} key columns "
            "gives: this operator's keys cannot be placed by a rewrite",
            store=str(plan.source),
            file=f"state/{kind.operator_id}",
            advice="The output is left unfinished; delete it. Report the operator: its keys need another rule.",
        )
    return _Placed(files, all_bounds, schemas)


def _write_store(
    plan: RewritePlan, kind: StoreKind, partition: int, state: pa.Table, schemas: tuple[str, str, str], work: str
) -> None:
    """Commits `state` (key order) as the whole state of version `plan.state_version` of the store."""
    location = _location(str(plan.output), kind, partition)
    key_schema, value_schema, key_encoding = schemas
    conf = plan.new_conf
    options = store_options(conf)
    ctx = StoreContext(
        store_dir=location.uri,
        operator_id=kind.operator_id,
        partition_id=partition,
        store_name=kind.store_name,
        key_schema=key_schema,
        value_schema=value_schema,
        min_versions_to_retain=int(conf.get("spark.sql.streaming.minBatchesToRetain", "100")),
        orphan_grace_seconds=float(options.get("orphanGraceSeconds", DEFAULT_ORPHAN_GRACE_SECONDS)),
        options=options,
        local_dir=work,
        key_encoding=key_encoding,
        views_dir=work,
        host_dir=work,
        min_deltas_for_snapshot=int(conf.get("spark.sql.streaming.stateStore.minDeltasForSnapshot", "10")),
    )
    backend = BACKENDS[options.get("backend", DEFAULT_BACKEND)](ctx, RemoteStore(location.uri))
    try:
        changes = pa.table(
            [pa.array(np.full(state.num_rows, frames.OP_PUT, np.int8)), state.column("key"), state.column("value")],
            schema=frames.CHANGES_SCHEMA,
        )
        backend.commit(
            plan.write_batch,
            changes,
            f"pystatestore-{plan.command}-{uuid.uuid4().hex}",
            "",
            num_keys=state.num_rows,
            empty_base=True,
        )
    finally:
        backend.close()


def rewrite_our_stores(
    plan: RewritePlan, progress: Progress, source: Callable[[StoreKind, Path], Source] | None = None
) -> list[StoreResult]:
    """Writes the state of every store of `plan` (the target is pystatestore) into the output, each
    store read back from its files and compared with what was written. `source(kind, work)` gives
    the source state, with `work` a scratch directory for its files; by default the source is
    pystatestore, read from its files."""
    results: list[StoreResult] = []
    for kind in plan.stores:
        started = time.perf_counter()
        # Scratch files sit beside the output (the rewrite's scratch directory): on its disk, not in a
        # /tmp that may be memory, and where the executors that export Spark's state can write.
        scratch_root = plan.output / SCRATCH_DIR
        if not scratch_root.is_dir():  # removed, never synced: the finished checkpoint names nothing in it
            local_disk.DISK.mkdir(str(scratch_root))
        with tempfile.TemporaryDirectory(prefix=f"{kind.operator_id}-{kind.store_name}-", dir=scratch_root) as scratch:
            work = Path(scratch)
            placed = _placed(plan, kind, (source or partial(our_source, plan))(kind, work), work, progress)
            schemas = placed.schemas
            total = 0
            for t in range(plan.target_partitions):
                progress(f"writing {kind.label}", t, plan.target_partitions)
                state = placed.target_state(t)
                _write_store(plan, kind, t, state, schemas, str(work))
                with StoreReader(_location(str(plan.output), kind, t)) as reader:
                    back = reader.state_table(plan.state_version)
                if back.schema != state.schema:
                    back = back.cast(state.schema)
                if not back.equals(state):
                    raise RewriteError(
                        f"{kind.label} partition {t}: read back {back.num_rows} rows, not the {state.num_rows} written",
                        store=str(plan.output),
                        version=plan.state_version,
                        advice="The output is left unfinished; delete it and report this with the worker logs.",
                    )
                total += state.num_rows
            progress(f"writing {kind.label}", plan.target_partitions, plan.target_partitions)
        results.append(StoreResult(kind, total, plan.target_partitions, time.perf_counter() - started))
    return results


__all__ = ["Source", "our_source", "rewrite_our_stores", "store_options", "stored_key_encoding"]
