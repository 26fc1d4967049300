"""Which shuffle partition Spark gives a key, computed without a JVM: a point lookup reads one
partition's store instead of every one.

A stateful operator's input is hash-partitioned on its key columns (aggregation's grouping keys,
dropDuplicates' columns, the groups of (flat)MapGroupsWithState and applyInPandasWithState, a join's
keys), and the state key is made of those same columns. Spark's partition is
`pmod(murmur3(key columns, seed 42), numPartitions)`, with its own flavour of Murmur3 x86_32 (bytes
that do not fill a 4-byte word are mixed in one at a time, as signed ints) and its own rules per
type (floats' -0.0 hashes as 0; decimals of up to 18 digits hash their unscaled long, longer ones
the bytes of their unscaled BigInteger; a struct folds its fields, each field's hash seeding the
next). Values are what `unsafe_row` decodes: ints, Decimal, str, bytes, date, datetime, tuples.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np
import pyarrow as pa

from ..store.manifest import KEY_ENCODING_PREFIX, KEY_ENCODING_RAW
from .unsafe_row import (
    MAX_LONG_DECIMAL_DIGITS,
    RowDecodeError,
    SparkType,
    UnsupportedTypeError,
    decode_row,
    epoch_number,
    java_big_integer_bytes,
    key_row_bytes,
    unscaled_of,
)

SEED = 42  # Murmur3Hash's seed in HashPartitioning
_C1, _C2 = 0xCC9E2D51, 0x1B873593
_MASK = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK


def _mix_k1(k1: int) -> int:
    return (_rotl((k1 * _C1) & _MASK, 15) * _C2) & _MASK


def _mix_h1(h1: int, k1: int) -> int:
    return (_rotl(h1 ^ k1, 13) * 5 + 0xE6546B64) & _MASK


def _fmix(h1: int, length: int) -> int:
    h1 ^= length
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _MASK
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _MASK
    return h1 ^ (h1 >> 16)


def _signed(h: int) -> int:
    return h - (1 << 32) if h & 0x80000000 else h


def hash_int(value: int, seed: int) -> int:
    return _signed(_fmix(_mix_h1(seed & _MASK, _mix_k1(value & _MASK)), 4))


def hash_long(value: int, seed: int) -> int:
    low, high = value & _MASK, (value >> 32) & _MASK
    h1 = _mix_h1(_mix_h1(seed & _MASK, _mix_k1(low)), _mix_k1(high))
    return _signed(_fmix(h1, 8))


def hash_bytes(data: bytes, seed: int) -> int:
    """Spark's hashUnsafeBytes: whole little-endian 4-byte words, then each remaining byte alone."""
    h1 = seed & _MASK
    aligned = len(data) - len(data) % 4
    for (word,) in struct.iter_unpack("<I", data[:aligned]):
        h1 = _mix_h1(h1, _mix_k1(word))
    for b in data[aligned:]:
        h1 = _mix_h1(h1, _mix_k1((b - 256 if b > 127 else b) & _MASK))
    return _signed(_fmix(h1, len(data)))


def hash_value(t: SparkType, value: Any, seed: int) -> int:
    """Spark's Murmur3 hash of one value of type `t`, starting from `seed`."""
    if value is None:
        return seed
    name = t.name
    if name == "boolean":
        return hash_int(1 if value else 0, seed)
    if name in ("byte", "short", "integer", "year-month interval"):
        return hash_int(value, seed)
    if name == "date":
        return hash_int(epoch_number(name, value), seed)
    if name == "long":
        return hash_long(value, seed)
    if name in ("timestamp", "timestamp_ntz", "day-time interval"):
        return hash_long(epoch_number(name, value), seed)
    if name == "float":
        if value == 0.0 or math.isnan(value):  # -0.0 hashes as 0; NaN as Java's one NaN
            return hash_int(0 if value == 0.0 else 0x7FC00000, seed)
        return hash_int(struct.unpack("<i", struct.pack("<f", value))[0], seed)
    if name == "double":
        if value == 0.0 or math.isnan(value):
            return hash_long(0 if value == 0.0 else 0x7FF8000000000000, seed)
        return hash_long(struct.unpack("<q", struct.pack("<d", value))[0], seed)
    if name == "decimal":
        unscaled = unscaled_of(t, value)
        if t.precision <= MAX_LONG_DECIMAL_DIGITS:
            return hash_long(unscaled, seed)
        return hash_bytes(java_big_integer_bytes(unscaled), seed)
    if name == "string":
        return hash_bytes(value.encode("utf-8"), seed)
    if name == "binary":
        return hash_bytes(bytes(value), seed)
    if name == "struct":
        for (_, ft, _), v in zip(t.fields, value, strict=True):
            seed = hash_value(ft, v, seed)
        return seed
    if name == "array":
        assert t.element is not None
        for v in value:
            seed = hash_value(t.element, v, seed)
        return seed
    raise UnsupportedTypeError(f"Spark type {name} has no partition hash here")


def partition_of(key_type: SparkType, key: tuple[Any, ...], num_partitions: int) -> int:
    """The shuffle partition, of `num_partitions`, that Spark's HashPartitioning on the key's
    columns sends `key` to: pmod(murmur3(columns, 42), n)."""
    return hash_value(key_type, key, SEED) % num_partitions  # Python's % of a positive n is pmod


# -- many stored keys at once ---------------------------------------------------------------------
# A rewrite places every key of a store: the same hash, computed on numpy columns of uint32 (whose
# arithmetic wraps as Java's int does) straight from the stored UnsafeRow bytes, without decoding
# a key into Python values. Types without a column form here go key by key through hash_value.

_U32 = np.uint32
_SLOT_WIDTH = {"boolean": 1, "byte": 1, "short": 2, "integer": 4, "date": 4, "year-month interval": 4, "float": 4}
_LONG_TYPES = ("long", "timestamp", "timestamp_ntz", "day-time interval", "double")


def _column_hashable(t: SparkType) -> bool:
    return (
        t.name in _SLOT_WIDTH
        or t.name in _LONG_TYPES
        or t.name in ("string", "binary")
        or (t.name == "decimal" and t.precision <= MAX_LONG_DECIMAL_DIGITS)
    )


def _rotl_v(x: np.ndarray, r: int) -> np.ndarray:
    return (x << _U32(r)) | (x >> _U32(32 - r))


def _mix_k1_v(k1: np.ndarray) -> np.ndarray:
    return _rotl_v(k1 * _U32(_C1), 15) * _U32(_C2)


def _mix_h1_v(h1: np.ndarray, k1: np.ndarray) -> np.ndarray:
    return _rotl_v(h1 ^ k1, 13) * _U32(5) + _U32(0xE6546B64)


def _fmix_v(h1: np.ndarray, length: int) -> np.ndarray:
    h1 = h1 ^ _U32(length)
    h1 ^= h1 >> _U32(16)
    h1 *= _U32(0x85EBCA6B)
    h1 ^= h1 >> _U32(13)
    h1 *= _U32(0xC2B2AE35)
    return h1 ^ (h1 >> _U32(16))


def _gather(data: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    """The `width` bytes at each position `at` of `data`, one row each."""
    return data[at[:, None] + np.arange(width)]


def _little_endian(data: np.ndarray, at: np.ndarray, width: int, signed: bool) -> np.ndarray:
    """The little-endian integers of `width` bytes at each position, as int64 (sign-extended when `signed`)."""
    raw = np.zeros((len(at), 8), np.uint8)
    raw[:, :width] = _gather(data, at, width)
    out = raw.view("<i8").ravel()
    if signed and width < 8:
        shift = np.int64(64 - 8 * width)
        out = (out << shift) >> shift
    return out


def _hash_fixed(t: SparkType, data: np.ndarray, slot: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """hash_value of each fixed-width value in its 8-byte slot."""
    if t.name in _SLOT_WIDTH:
        v = _little_endian(data, slot, _SLOT_WIDTH[t.name], signed=True)
        if t.name == "float":  # -0.0 hashes as 0, every NaN as Java's one NaN
            f = (v & 0xFFFFFFFF).astype(np.uint32).view(np.float32)
            v = np.where(f == 0.0, 0, np.where(np.isnan(f), 0x7FC00000, v))
        return _fmix_v(_mix_h1_v(seed, _mix_k1_v(v.astype(np.uint32))), 4)
    v = _little_endian(data, slot, 8, signed=True)
    if t.name == "double":
        d = v.view(np.float64)
        v = np.where(d == 0.0, 0, np.where(np.isnan(d), 0x7FF8000000000000, v))
    low, high = (v & 0xFFFFFFFF).astype(np.uint32), ((v >> 32) & 0xFFFFFFFF).astype(np.uint32)
    return _fmix_v(_mix_h1_v(_mix_h1_v(seed, _mix_k1_v(low)), _mix_k1_v(high)), 8)


def _hash_variable(data: np.ndarray, start: np.ndarray, size: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """hash_bytes of each value of `size` bytes at `start`: whole words, then each byte alone (as
    a signed int); values of one length at a time, so every step is one column operation."""
    out = np.empty_like(seed)
    for length in np.unique(size):
        rows = np.flatnonzero(size == length)
        h, at = seed[rows], start[rows]
        words = int(length) // 4
        if words:
            packed = _gather(data, at, words * 4).view("<u4")
            for w in range(words):
                h = _mix_h1_v(h, _mix_k1_v(packed[:, w].copy()))
        for b in range(words * 4, int(length)):
            h = _mix_h1_v(h, _mix_k1_v(data[at + b].view(np.int8).astype(np.int32).astype(np.uint32)))
        out[rows] = _fmix_v(h, int(length))
    return out


def stored_key_hashes(key_type: SparkType, keys: pa.Array, key_encoding: str, num_fields: int) -> np.ndarray:
    """Spark's Murmur3 hash (seed 42) of the first `num_fields` key columns of each stored key (an
    UnsafeRow, after its prefix row where `key_encoding` puts one), as int32: what `hash_value`
    gives for the decoded key, computed column by column."""
    keys = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
    if pa.types.is_large_binary(keys.type):
        keys = keys.cast(pa.binary())
    n = len(keys)
    fields = key_type.fields[:num_fields]
    if n == 0:
        return np.zeros(0, np.int32)
    if not all(_column_hashable(t) for _, t, _ in fields):
        hashed = SparkType("struct", fields=fields)
        return np.array(
            [
                hash_value(hashed, decode_row(key_type, key_row_bytes(k, key_encoding))[:num_fields], SEED)
                for k in keys.to_pylist()
            ],
            np.int32,
        )
    _, offsets_buf, data_buf = keys.buffers()
    offsets = np.frombuffer(offsets_buf, np.int32)[keys.offset : keys.offset + n + 1].astype(np.int64)
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    row = offsets[:-1]
    end = offsets[1:]
    if key_encoding == KEY_ENCODING_PREFIX:
        prefix = _gather(data, row, 4).astype(np.int64)
        row = row + 4 + ((prefix[:, 0] << 24) | (prefix[:, 1] << 16) | (prefix[:, 2] << 8) | prefix[:, 3])
    elif key_encoding != KEY_ENCODING_RAW:
        raise RowDecodeError(f"unknown key encoding {key_encoding!r}")
    bitset = ((len(key_type.fields) + 63) // 64) * 8
    if np.any(row + bitset + 8 * len(key_type.fields) > end):
        raise RowDecodeError(f"stored keys shorter than an UnsafeRow of {len(key_type.fields)} fields")
    h = np.full(n, SEED, np.uint32)
    for i, (_, t, _) in enumerate(fields):
        null = (data[row + (i >> 3)] & (1 << (i & 7))) != 0
        slot = row + bitset + 8 * i
        if t.name in ("string", "binary"):
            packed = _little_endian(data, slot, 8, signed=False)
            start, size = row + (packed >> 32), packed & 0xFFFFFFFF
            outside = ~null & ((start < row) | (start + size > end))
            if np.any(outside):
                raise RowDecodeError(f"a value of key column {i} lies outside its row")
            size = np.where(null, 0, size)
            start = np.where(null, row, start)
            hashed = _hash_variable(data, start, size, h)
        else:
            hashed = _hash_fixed(t, data, slot, h)
        h = np.where(null, h, hashed)
    return h.view(np.int32)


__all__ = [
    "SEED",
    "hash_bytes",
    "hash_int",
    "hash_long",
    "hash_value",
    "partition_of",
    "stored_key_hashes",
]
