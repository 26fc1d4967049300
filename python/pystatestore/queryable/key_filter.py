"""A scan's first test of a key, on its UnsafeRow bytes: a partial key's integer and string columns
are compared where the row keeps them, so keys that cannot match are passed over without being
decoded (most of a selective scan's time went to decoding every key of every partition).

The test only rejects: a key it lets through is decoded and matched as before, so its verdict never
differs from the decoded match. Columns of other types (and values of another JSON type than the
column's, which the decoded match may still accept: 1.0 for an integer) are left to that match.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from ..reading.unsafe_row import SparkType, bitset_bytes

# Integer columns: the struct format of the value at the start of its 8-byte slot.
_INTEGERS = {"byte": "<b", "short": "<h", "integer": "<i", "long": "<q"}
_SLOT = 8


def key_prefilter(key_type: SparkType, names: list[str], wanted: dict[str, Any]) -> Callable[[memoryview], bool] | None:
    """A test that is False for a key row that cannot have `wanted`'s values (columns by the names
    the tools show, `names`, in the row's order), or None when no given column can be tested on
    bytes."""
    slots = bitset_bytes(len(key_type.fields))
    fixed: list[tuple[int, bytes]] = []  # (slot offset, the value's bytes)
    strings: list[tuple[int, bytes]] = []  # (slot offset, the UTF-8 bytes)
    for i, (name, (_, column, _)) in enumerate(zip(names, key_type.fields, strict=True)):
        given = wanted.get(name)
        at = slots + _SLOT * i
        if column.name in _INTEGERS and type(given) is int:
            try:
                fixed.append((at, struct.pack(_INTEGERS[column.name], given)))
            except struct.error:  # out of the column's range: no key has it
                return lambda row: False
        elif column.name == "string" and isinstance(given, str):
            strings.append((at, given.encode("utf-8")))
    if not fixed and not strings:
        return None
    slots_end = slots + _SLOT * len(key_type.fields)

    def may_match(row: memoryview) -> bool:
        if len(row) < slots_end:
            return True  # not a row of this schema: the decoder says so
        for at, value in fixed:
            if row[at : at + len(value)] != value:
                return False
        for at, value in strings:
            packed = int.from_bytes(row[at : at + _SLOT], "little")
            offset, size = packed >> 32, packed & 0xFFFFFFFF
            if size != len(value):
                return False
            if offset + size <= len(row) and row[offset : offset + size] != value:
                return False
        return True

    return may_match


__all__ = ["key_prefilter"]
