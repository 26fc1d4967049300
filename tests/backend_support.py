"""Helpers for driving backends directly, without Spark."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from pystatestore import frames
from pystatestore.backends import BACKENDS, StateBackend, StoreContext
from pystatestore.remote import RemoteStore


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


def make_backend(
    name: str,
    store_dir: Path,
    local_dir: Path,
    retain: int = 100,
    grace: float = 600.0,
    options: dict[str, str] | None = None,
) -> StateBackend:
    """A backend as a worker would open it. Local recovery copies go under `local_dir` unless the
    options say otherwise, so tests never share them by accident."""
    opts = {"localRecoveryDir": str(Path(local_dir) / "recovery"), **(options or {})}
    ctx = StoreContext(
        store_dir=f"file:{store_dir}",
        operator_id=0,
        partition_id=1,
        store_name="default",
        key_schema="k",
        value_schema="v",
        min_versions_to_retain=retain,
        orphan_grace_seconds=grace,
        local_dir=str(local_dir),
        options=opts,
    )
    return BACKENDS[name](ctx, RemoteStore(ctx.store_dir))


def state_of(backend: StateBackend, version: int) -> dict[bytes, bytes]:
    return frames.buffer_to_state(backend.load(version).frame)
