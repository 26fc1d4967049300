"""The offline reader of column families (reading/families.py) on stored bytes laid out by hand as the
JVM lays them out (decision 0027): the registry, each key layout after the 2-byte family id, lists
of several values with their zero padding, and damaged lists. Spark's own reads of a real
transformWithState checkpoint are compared in tests/test_transform_with_state.py."""

from __future__ import annotations

import json
import struct

import pytest

from pystatestore.reading.families import Family, family_counts, family_prefix, registry
from pystatestore.reading.unsafe_row import RowDecodeError, SchemaError, decode_row, parse_schema


def long_row(v: int) -> bytes:
    """An UnsafeRow of one non-null long: an 8-byte null bitset, then the value."""
    return bytes(8) + struct.pack("<q", v)


def string_row(s: str) -> bytes:
    """An UnsafeRow of one non-null string: bitset, (offset << 32 | size), the bytes padded to 8."""
    data = s.encode()
    return bytes(8) + struct.pack("<q", (16 << 32) | len(data)) + data + bytes(-len(data) % 8)


LONG = json.dumps({"type": "struct", "fields": [{"name": "v", "type": "long", "nullable": True, "metadata": {}}]})


def registry_value(fid: int, encoding: str, multiple: bool, args: str) -> bytes:
    """The registry's value row: id, keyEncoding, multipleValues, keySchema, valueSchema, encoderArgs."""
    strings = [encoding.encode(), LONG.encode(), LONG.encode(), args.encode()]
    fixed = bytearray(8 + 6 * 8)
    variable = bytearray()
    fixed[8:16] = struct.pack("<q", fid)
    fixed[24:32] = struct.pack("<q", int(multiple))
    for slot, data in zip((2, 4, 5, 6), strings, strict=True):
        offset = len(fixed) + len(variable)
        fixed[slot * 8 : slot * 8 + 8] = struct.pack("<q", (offset << 32) | len(data))
        variable += data + bytes(-len(data) % 8)
    return bytes(fixed + variable)


def test_the_registry_and_each_key_layout_decode() -> None:
    pairs = [
        (family_prefix(0) + string_row(""), registry_value(9, "", False, "")),  # the highest id given
        (family_prefix(0) + string_row("seen"), registry_value(2, "raw", True, "")),
        (family_prefix(0) + string_row("timers"), registry_value(3, "range-v1", False, "0")),
        (family_prefix(1) + long_row(5), long_row(1)),  # past the registry: never read as an entry
    ]
    found = registry(pairs)
    assert sorted(found) == ["seen", "timers"]
    seen, timers = found["seen"], found["timers"]
    assert (seen.family_id, seen.key_encoding, seen.multiple_values) == (2, "raw", True)
    assert (timers.family_id, timers.encoder_args) == (3, "0")
    key_type = parse_schema(LONG)
    # range-v1: one ordering column (a long): a sign byte and 8 bytes, then the key row
    stored = family_prefix(3) + b"\x01" + struct.pack(">q", 42) + long_row(42)
    assert decode_row(key_type, timers.key_row(stored)) == (42,)
    prefixed = Family("p", 4, "prefix-v1", False, LONG, LONG, "1")
    stored = family_prefix(4) + struct.pack(">i", 16) + long_row(7) + long_row(8)
    assert decode_row(key_type, prefixed.key_row(stored)) == (8,)


def test_lists_of_values_stop_at_the_padding_and_damage_is_named() -> None:
    seen = Family("seen", 2, "raw", True, LONG, LONG, "")
    rows = [long_row(1), long_row(-3), long_row(8)]  # 3 x (4 + 16) bytes: 4 bytes of padding follow
    stored = b"".join(struct.pack(">i", len(r)) + r for r in rows)
    stored += bytes(-len(stored) % 8)
    assert len(stored) == 64
    assert [bytes(v) for v in seen.values(stored)] == rows
    single = Family("count", 1, "raw", False, LONG, LONG, "")
    assert [bytes(v) for v in single.values(long_row(4))] == [long_row(4)]
    with pytest.raises(RowDecodeError, match="seen"):
        list(seen.values(struct.pack(">i", 64) + long_row(1)))


def test_family_counts_count_keys_and_each_listed_value() -> None:
    listed = b"".join(struct.pack(">i", 16) + long_row(v) for v in (1, 2, 3)) + bytes(4)
    pairs = [
        (family_prefix(0) + string_row("count"), registry_value(1, "raw", False, "")),
        (family_prefix(0) + string_row("empty"), registry_value(3, "raw", False, "")),
        (family_prefix(0) + string_row("seen"), registry_value(2, "raw", True, "")),
        (family_prefix(1) + long_row(5), long_row(1)),
        (family_prefix(1) + long_row(6), long_row(2)),
        (family_prefix(2) + long_row(5), listed),
    ]
    counts = {c.family.name: (c.keys, c.values, c.key_bytes, c.value_bytes) for c in family_counts(pairs)}
    assert counts == {"count": (2, 2, 36, 32), "seen": (1, 3, 18, 64), "empty": (0, 0, 0, 0)}
    with pytest.raises(SchemaError, match="id 7"):
        family_counts([*pairs, (family_prefix(7) + long_row(1), long_row(1))])
