"""Changelog segments: one version's changes as a changelog commit stores them (DESIGN §3).

A segment is the change frame the JVM sent (op, key, value; sorted by key for the rocksdb backend)
in a compact columnar form, compressed with zstd: per chunk of rows, the ops, the key offsets and
bytes, the value offsets, validity and bytes. Arrow IPC would carry ~500 bytes of schema and
message metadata, more than the rows of a typical small commit; this carries a few bytes per chunk.
Segments are written and read chunk by chunk, so neither side holds a large commit whole. Arrow's
own kernels do the array work: the worker does not load numpy (about 13 MiB per worker).

    magic | chunk* | u32 0          chunk = u32 rows | ops | key offsets | keys | value offsets |
                                            value validity | values      (offsets: u32 LE, rows+1)
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from .frames import CHANGES_SCHEMA

MAGIC = b"PSSCHG1\n"
CODEC = "zstd"
_U32 = struct.Struct("<I")


class SegmentFormatError(ValueError):
    """The bytes are not a changelog segment (damaged, truncated or something else)."""


def _values_bytes(arr: pa.Array, width: int) -> memoryview:
    """The value buffer of a fixed-width array without nulls, from its slice offset on (Arrow
    buffers are little-endian on every platform pyarrow ships for); a view, not a copy."""
    return memoryview(arr.buffers()[1])[arr.offset * width : (arr.offset + len(arr)) * width]


def _binary_parts(arr: pa.Array) -> tuple[memoryview, memoryview | bytes]:
    """Offsets (from 0, u32 LE, len+1) and bytes of a binary array, whatever its slice offset."""
    n = len(arr)
    buffers = arr.buffers()
    offsets = pa.Array.from_buffers(pa.int32(), n + 1, [None, buffers[1]], offset=arr.offset)
    start, end = offsets[0].as_py(), offsets[n].as_py()
    data = memoryview(buffers[2])[start:end] if buffers[2] is not None and end > start else b""
    from_zero = offsets if start == 0 else pc.subtract(offsets, pa.scalar(start, pa.int32()))
    return _values_bytes(from_zero.cast(pa.uint32()), 4), data


def encode_chunk(batch: pa.RecordBatch) -> list[bytes | memoryview]:
    """A chunk's parts in the order a segment holds them: views of the batch's buffers where they
    can be, so 10 MB of values reach the compressor without being copied twice first."""
    n = batch.num_rows
    ops = _values_bytes(batch.column(0), 1)  # int8 ops, stored as their bytes
    key_offsets, keys = _binary_parts(batch.column(1))
    value_col = batch.column(2)
    value_offsets, values = _binary_parts(value_col)
    valid = _values_bytes(value_col.is_valid().cast(pa.uint8()), 1)
    return [_U32.pack(n), ops, key_offsets, keys, value_offsets, valid, values]


class SegmentWriter:
    """Writes a segment to `path` chunk by chunk; `close()` returns the number of rows."""

    def __init__(self, path: Path) -> None:
        self._file = pa.OSFile(str(path), "wb")
        self._out = pa.CompressedOutputStream(self._file, CODEC)
        self._out.write(MAGIC)
        self.rows = 0

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows:
            for part in encode_chunk(batch):
                self._out.write(part)
            self.rows += batch.num_rows

    def close(self) -> int:
        self._out.write(_U32.pack(0))
        self._out.close()  # also closes the file
        return self.rows

    def abort(self) -> None:
        try:
            self._out.close()
        except (OSError, pa.ArrowException):
            pass


def write_segment(path: Path, batches: Iterable[pa.RecordBatch]) -> int:
    writer = SegmentWriter(path)
    try:
        for batch in batches:
            writer.write(batch)
    except BaseException:
        writer.abort()
        raise
    return writer.close()


def _read_exact(stream: pa.NativeFile, n: int) -> bytes:
    data = stream.read(n)
    if len(data) != n:
        raise SegmentFormatError(f"truncated: wanted {n} bytes, got {len(data)}")
    return data


def _offsets(stream: pa.NativeFile, n: int) -> tuple[bytes, int]:
    raw = _read_exact(stream, 4 * (n + 1))
    offsets = pa.Array.from_buffers(pa.uint32(), n + 1, [None, pa.py_buffer(raw)])
    if offsets[0].as_py() != 0 or pc.any(pc.less(offsets.slice(1), offsets.slice(0, n))).as_py():
        raise SegmentFormatError("offsets out of order")
    return raw, offsets[n].as_py()


def read_segment(source: bytes | Path) -> Iterator[pa.RecordBatch]:
    """The segment's chunks as change-frame batches (CHANGES_SCHEMA), in the order written."""
    raw = pa.py_buffer(source) if isinstance(source, (bytes, bytearray, memoryview)) else pa.OSFile(str(source), "rb")
    try:
        stream = pa.CompressedInputStream(raw if isinstance(raw, pa.NativeFile) else pa.BufferReader(raw), CODEC)
        if stream.read(len(MAGIC)) != MAGIC:
            raise SegmentFormatError("not a pystatestore changelog segment")
        while True:
            (n,) = _U32.unpack(_read_exact(stream, 4))
            if n == 0:
                return
            ops = pa.py_buffer(_read_exact(stream, n))
            key_offsets, key_len = _offsets(stream, n)
            keys = _read_exact(stream, key_len)
            value_offsets, value_len = _offsets(stream, n)
            valid = pa.Array.from_buffers(pa.uint8(), n, [None, pa.py_buffer(_read_exact(stream, n))]).cast(pa.bool_())
            values = _read_exact(stream, value_len)
            yield pa.record_batch(
                [
                    pa.Array.from_buffers(pa.int8(), n, [None, ops]),
                    pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(key_offsets), pa.py_buffer(keys)]),
                    pa.Array.from_buffers(
                        pa.binary(),
                        n,
                        [valid.buffers()[1], pa.py_buffer(value_offsets), pa.py_buffer(values)],
                        null_count=n - valid.true_count,
                    ),
                ],
                schema=CHANGES_SCHEMA,
            )
    except (pa.ArrowInvalid, OSError) as e:
        raise SegmentFormatError(f"unreadable ({e})") from None
    finally:
        if isinstance(raw, pa.NativeFile):
            raw.close()
