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

from .unsafe_row import (
    MAX_LONG_DECIMAL_DIGITS,
    SparkType,
    UnsupportedTypeError,
    epoch_number,
    java_big_integer_bytes,
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


__all__ = ["SEED", "hash_bytes", "hash_int", "hash_long", "hash_value", "partition_of"]
