"""Arrow IPC frames exchanged with the JVM shim (schemas documented in docs/ARCHITECTURE.md)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import pyarrow as pa

OP_PUT = 1
OP_DELETE = 2
STATE_SCHEMA = pa.schema([("key", pa.binary()), ("value", pa.binary())])
CHANGES_SCHEMA = pa.schema([("op", pa.int8()), ("key", pa.binary()), ("value", pa.binary())])
CHANGE_FEED_SCHEMA = pa.schema(
    [("version", pa.int64()), ("op", pa.int8()), ("key", pa.binary()), ("value", pa.binary())]
)
_BATCH_ROWS = 65536


Changes = pa.Table | pa.RecordBatchReader
"""A change frame: a table (Python callers, tests) or a stream read batch by batch (the JVM's)."""


@contextmanager
def open_changes(path: str) -> Iterator[pa.RecordBatchReader]:
    """The change frame at `path` as a stream: its batches are read one at a time, so a large
    commit never holds the whole frame in the worker's memory."""
    with pa.OSFile(path, "rb") as f:
        reader = pa.ipc.open_stream(f)
        if not reader.schema.equals(CHANGES_SCHEMA, check_metadata=False):
            raise ValueError(f"change frame {path} has schema {reader.schema}, expected {CHANGES_SCHEMA}")
        yield reader


def change_batches(changes: Changes, max_rows: int = _BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """The frame's batches, none longer than `max_rows`."""
    batches = changes.to_batches() if isinstance(changes, pa.Table) else changes
    for batch in batches:
        for start in range(0, batch.num_rows, max_rows):
            yield batch.slice(start, max_rows)


def sorted_by_key(changes: Changes) -> Changes:
    """A table sorted by key; a stream as it is (the JVM sends it sorted, and a reader checks)."""
    if isinstance(changes, pa.Table):
        return changes.sort_by([("key", "ascending")])
    return changes


def apply_changes(state: dict[bytes, bytes], changes: Changes) -> None:
    """Applies puts and deletes in frame order (a key appears at most once per frame)."""
    for batch in change_batches(changes):
        ops = batch.column(0).to_pylist()
        keys = batch.column(1).to_pylist()
        values = batch.column(2).to_pylist()
        for op, key, value in zip(ops, keys, values, strict=True):
            if op == OP_PUT:
                state[key] = value
            elif op == OP_DELETE:
                state.pop(key, None)
            else:
                raise ValueError(f"unknown op {op} in change frame")


def change_feed_batch(version: int, changes: pa.RecordBatch) -> pa.RecordBatch:
    """One version's changes (op, key, value) as a batch of the change feed frame."""
    versions = pa.array([version] * changes.num_rows, pa.int64())
    return pa.record_batch([versions, *changes.columns], schema=CHANGE_FEED_SCHEMA)


def state_batch(keys: list[bytes], values: list[bytes]) -> pa.RecordBatch:
    return pa.record_batch([pa.array(keys, pa.binary()), pa.array(values, pa.binary())], schema=STATE_SCHEMA)


def state_to_buffer(state: Mapping[bytes, bytes]) -> pa.Buffer:
    """Serialises key/value pairs as one Arrow IPC stream (also the memory backend's snapshot)."""
    sink = pa.BufferOutputStream()
    keys = list(state.keys())
    with pa.ipc.new_stream(sink, STATE_SCHEMA) as writer:
        for i in range(0, max(len(keys), 1), _BATCH_ROWS):
            chunk = keys[i : i + _BATCH_ROWS]
            writer.write_batch(state_batch(chunk, [state[k] for k in chunk]))
    return sink.getvalue()


def buffer_to_state(buf: pa.Buffer) -> dict[bytes, bytes]:
    table = pa.ipc.open_stream(buf).read_all()
    if not table.schema.equals(STATE_SCHEMA, check_metadata=False):
        raise ValueError(f"state frame has schema {table.schema}, expected {STATE_SCHEMA}")
    return dict(zip(table.column("key").to_pylist(), table.column("value").to_pylist(), strict=True))


def write_buffer(path: str, buf: pa.Buffer) -> None:
    with pa.OSFile(path, "wb") as f:
        f.write(buf)
