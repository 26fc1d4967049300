"""The UnsafeRow decoder on hand-laid rows: layout details Spark's own rows in test_cli.py may not
reach (negative numbers, long decimals, prefix-encoded keys, empty and null collections), and the
clear errors for bytes that do not fit the schema. The row-for-row comparison with Spark's state
reader is in test_cli.py."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import struct

import pyarrow as pa
import pytest

from pystatestore.reading.unsafe_row import (
    RowDecodeError,
    SchemaError,
    StateRowDecoder,
    UnsupportedTypeError,
    decode_row,
    parse_schema,
)
from pystatestore.store.manifest import KEY_ENCODING_PREFIX


def schema(*fields: tuple[str, object]) -> str:
    return json.dumps(
        {"type": "struct", "fields": [{"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in fields]}
    )


def row(slots: list[bytes], variable: bytes = b"", nulls: int = 0) -> bytes:
    """An UnsafeRow: one 64-bit null word (up to 64 fields), 8-byte slots, then the variable part."""
    assert all(len(s) == 8 for s in slots)
    return struct.pack("<Q", nulls) + b"".join(slots) + variable


def offset_and_size(offset: int, size: int) -> bytes:
    return struct.pack("<Q", (offset << 32) | size)


def test_fixed_width_values_and_nulls() -> None:
    t = parse_schema(schema(("l", "long"), ("i", "integer"), ("b", "boolean"), ("d", "date"), ("ts", "timestamp")))
    data = row(
        [
            struct.pack("<q", -5),
            struct.pack("<i", -7) + b"\0" * 4,
            b"\x01" + b"\0" * 7,
            struct.pack("<i", -1) + b"\0" * 4,
            b"\0" * 8,
        ],
        nulls=1 << 4,
    )
    assert decode_row(t, data) == (-5, -7, True, dt.date(1969, 12, 31), None)


def test_strings_long_decimals_and_nested_rows() -> None:
    t = parse_schema(
        schema(
            ("s", "string"),
            ("big", "decimal(30,2)"),
            ("inner", {"type": "struct", "fields": [{"name": "x", "type": "short", "nullable": True}]}),
        )
    )
    base = 8 + 3 * 8
    text = "héllo".encode()
    unscaled = (-123456789012345678901234).to_bytes(11, "big", signed=True)
    inner = struct.pack("<Q", 0) + struct.pack("<h", -3) + b"\0" * 6
    variable = text.ljust(8, b"\0") + unscaled.ljust(16, b"\0") + inner
    data = row(
        [
            offset_and_size(base, len(text)),
            offset_and_size(base + 8, len(unscaled)),
            offset_and_size(base + 24, len(inner)),
        ],
        variable,
    )
    assert decode_row(t, data) == ("héllo", decimal.Decimal("-1234567890123456789012.34"), (-3,))


def test_arrays_and_maps_with_nulls() -> None:
    t = parse_schema(
        schema(
            ("a", {"type": "array", "elementType": "integer", "containsNull": True}),
            ("m", {"type": "map", "keyType": "string", "valueType": "long", "valueContainsNull": True}),
            ("e", {"type": "array", "elementType": "string", "containsNull": True}),
        )
    )
    # array<int> [1, null, 3]: count, null word (bit 1), 3 x 4-byte elements padded to 16
    array = struct.pack("<q", 3) + struct.pack("<Q", 0b10) + struct.pack("<iii", 1, 0, 3) + b"\0" * 4
    keys = struct.pack("<q", 1) + struct.pack("<Q", 0) + offset_and_size(24, 1) + b"k".ljust(8, b"\0")
    values = struct.pack("<q", 1) + struct.pack("<Q", 0) + struct.pack("<q", 42)
    mapped = struct.pack("<q", len(keys)) + keys + values
    empty = struct.pack("<q", 0)
    base = 8 + 3 * 8
    data = row(
        [
            offset_and_size(base, len(array)),
            offset_and_size(base + len(array), len(mapped)),
            offset_and_size(base + len(array) + len(mapped), len(empty)),
        ],
        array + mapped + empty,
    )
    decoded = decode_row(t, data)
    assert decoded == ([1, None, 3], [("k", 42)], [])
    arrow = pa.array([decoded], t.to_arrow())
    assert arrow.to_pylist() == [{"a": [1, None, 3], "m": [("k", 42)], "e": []}]


def test_prefix_encoded_keys_decode_the_whole_key_row() -> None:
    decoder = StateRowDecoder(schema(("k", "long")), schema(("v", "long")), KEY_ENCODING_PREFIX)
    whole = row([struct.pack("<q", 9)])
    prefix = row([struct.pack("<q", 1)])
    assert decoder.key(struct.pack(">i", len(prefix)) + prefix + whole) == (9,)


def test_bytes_that_do_not_fit_the_schema_are_refused_clearly() -> None:
    t = parse_schema(schema(("s", "string"), ("l", "long")))
    with pytest.raises(RowDecodeError, match="whole number of 8-byte words"):
        decode_row(t, b"\0" * 12)
    with pytest.raises(RowDecodeError, match="cannot hold a row of 2 fields"):
        decode_row(t, b"\0" * 16)
    with pytest.raises(RowDecodeError, match="outside its 24-byte row"):
        decode_row(t, row([offset_and_size(16, 64), b"\0" * 8]))


def test_types_it_cannot_read_are_named() -> None:
    with pytest.raises(UnsupportedTypeError, match="'variant'"):
        parse_schema(schema(("v", "variant")))
    with pytest.raises(SchemaError, match="not Spark schema JSON"):
        parse_schema("k")
