"""Helpers for driving backends directly, without Spark."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import rocksdict

from pystatestore.store import frames
from pystatestore.store.backends import BACKENDS, CommitResult, StateBackend, StoreContext
from pystatestore.store.manifest import Manifest
from pystatestore.store.remote import RemoteStore


def changes(puts: dict[bytes, bytes] | None = None, deletes: list[bytes] | tuple[bytes, ...] = ()) -> pa.Table:
    puts = puts or {}
    ops = [frames.OP_PUT] * len(puts) + [frames.OP_DELETE] * len(deletes)
    return pa.table(
        {
            "op": pa.array(ops, pa.int8()),
            "key": pa.array(list(puts) + list(deletes), pa.binary()),
            "value": pa.array(list(puts.values()) + [None] * len(deletes), pa.binary()),
        },
        schema=frames.CHANGES_SCHEMA,
    )


def hold_at(backend: StateBackend, point: str) -> tuple[threading.Event, threading.Event]:
    """Makes `backend` stop at its fault point `point` until `release` is set (at most 30 s);
    `reached` is set when a call gets there. Returns (reached, release)."""
    reached, release = threading.Event(), threading.Event()

    def hold(at: str) -> None:
        if at == point:
            reached.set()
            release.wait(30)

    backend.fault_hook = hold
    return reached, release


def make_backend(
    name: str,
    store_dir: Path,
    local_dir: Path,
    retain: int = 100,
    grace: float = 600.0,
    options: dict[str, str] | None = None,
    mode: str | None = None,
    min_deltas: int = 10,
    store_uri: str | None = None,
    checkpoint_ids: bool = False,
    partition_id: int = 1,
    schemas: tuple[str, str] = ("k", "v"),
) -> StateBackend:
    """A backend as a worker would open it. Local recovery copies go under `local_dir` unless the
    options say otherwise, so tests never share them by accident. `mode`: the rocksdb backend's
    commitMode (its default when None). `store_uri`: the store's location when it is not the local
    directory `store_dir` (an object store). `schemas`: the (key, value) schemas recorded in its
    manifests (Spark's JSON, for a store the checkpoint readers decode)."""
    opts = {"localRecoveryDir": str(Path(local_dir) / "recovery"), **(options or {})}
    if mode is not None:
        opts["commitMode"] = mode
    ctx = StoreContext(
        store_dir=store_uri or f"file:{store_dir}",
        operator_id=0,
        partition_id=partition_id,
        store_name="default",
        key_schema=schemas[0],
        value_schema=schemas[1],
        min_versions_to_retain=retain,
        orphan_grace_seconds=grace,
        local_dir=str(local_dir),
        options=opts,
        views_dir=str(Path(local_dir) / "views"),
        host_dir=str(local_dir),
        min_deltas_for_snapshot=min_deltas,
        checkpoint_ids=checkpoint_ids,
    )
    Path(ctx.views_dir).mkdir(parents=True, exist_ok=True)
    return BACKENDS[name](ctx, RemoteStore(ctx.store_dir))


def open_store(store: Path, local_dir: Path, retain: int = 100) -> StateBackend:
    """The rocksdb backend of a store a Spark query wrote, opened as its worker would open it (its
    identity read from one of its manifests), to inspect it without changing anything."""
    some = next(iter(sorted((store / "manifests").glob("*.json"))))
    m = Manifest.from_json(some.read_bytes(), store=str(store), version=int(some.stem), file=some.name)
    ctx = StoreContext(
        store_dir=str(m.store.get("dir") or store),  # changelog manifests leave the directory out
        operator_id=int(m.store["operatorId"]),
        partition_id=int(m.store["partitionId"]),
        store_name=str(m.store["storeName"]),
        key_schema=m.key_schema,
        value_schema=m.value_schema,
        min_versions_to_retain=retain,
        orphan_grace_seconds=600.0,
        local_dir=str(local_dir),
        options={"localRecovery": "false"},
        key_encoding=m.key_encoding,
    )
    return BACKENDS["rocksdb"](ctx, RemoteStore(ctx.store_dir))


def read_view(view_dir: str | Path) -> dict[bytes, bytes]:
    """Every pair of a read view, read as the JVM reads it: the directory opened read-only."""
    opts = rocksdict.Options(raw_mode=True)
    opts.create_if_missing(False)
    db = rocksdict.Rdict(str(view_dir), opts, access_type=rocksdict.AccessType.read_only())
    try:
        return dict(db.items())
    finally:
        db.close()


def state_of(backend: StateBackend, version: int, checkpoint_id: str | None = None) -> dict[bytes, bytes]:
    """The pairs of `version` (its attempt `checkpoint_id`, when given) as the JVM would see them: a
    frame, or a read view it opens."""
    if backend.read_path == "frame":
        return frames.buffer_to_state(backend.load(version, None, checkpoint_id).frame)
    view = Path(backend.ctx.views_dir) / f"test-{uuid.uuid4().hex}"
    try:
        result = backend.load(version, str(view), checkpoint_id)
        pairs = read_view(view)
        assert result.num_keys == len(pairs), (
            f"version {version}: manifest counts {result.num_keys}, view has {len(pairs)}"
        )
        return pairs
    finally:
        shutil.rmtree(view, ignore_errors=True)


def count_after(backend: StateBackend, base_version: int, table: pa.Table, base_manifest_id: str | None = None) -> int:
    """The key count of `base_version` with `table` applied, read through a separate instance (as
    the JVM knows it from its reads), so `backend`'s own local state is left alone."""
    if base_version == 0:
        state: dict[bytes, bytes] = {}
    else:
        local = tempfile.mkdtemp(prefix="pss-count-")
        ctx = dataclasses.replace(
            backend.ctx,
            local_dir=local,
            views_dir=str(Path(local) / "views"),
            options={**backend.ctx.options, "localRecovery": "false"},
        )
        Path(ctx.views_dir).mkdir()
        reader = type(backend)(ctx, RemoteStore(ctx.store_dir))
        try:
            state = state_of(reader, base_version, backend.attempt_for_lookup(base_manifest_id))
        finally:
            reader.close()
            shutil.rmtree(local, ignore_errors=True)
    frames.apply_changes(state, table)
    return len(state)


def commit(
    backend: StateBackend,
    base_version: int,
    table: pa.Table,
    attempt_id: str,
    base_manifest_id: str | None = None,
    *,
    num_keys: int | None = None,
    num_internal_keys: int = 0,
    durable_first: bool = False,
) -> CommitResult:
    """Commits as the JVM does: with the new version's key count (and, of them, those in internal
    column families) and a view directory, which is removed again (tests read versions through
    `state_of`). With `durable_first`, as the worker's service does: the commit may return once
    durable, and what it leaves (`finish`) runs at once; a failure there is the service's too (the
    version stays committed, the local DB is restored by the next call)."""
    if num_keys is None:
        num_keys = count_after(backend, base_version, table, base_manifest_id)
    view = Path(backend.ctx.views_dir) / f"commit-{uuid.uuid4().hex}"
    try:
        result = backend.commit(
            base_version,
            table,
            attempt_id,
            base_manifest_id,
            num_keys=num_keys,
            num_internal_keys=num_internal_keys,
            view_dir=str(view),
            durable_first=durable_first,
        )
        if result.finish is not None:
            try:
                result.finish()
            except Exception:  # noqa: BLE001, S110 - the service logs it and carries on likewise
                pass
        return result
    finally:
        shutil.rmtree(view, ignore_errors=True)


# The rocksdb backend's commit modes: tests of behaviour that does not depend on the mode run in both.
MODES = ("changelog", "snapshot")


def materialize_if_due(backend: StateBackend) -> Any:
    """What maintenance's snapshot part does, in one go: a snapshot of the newest version if one is
    due; returns the job (None when none was due)."""
    job = backend.prepare_materialization()
    if job is not None:
        backend.finish_materialization(job)
        backend.complete_materialization(job)
    return job
