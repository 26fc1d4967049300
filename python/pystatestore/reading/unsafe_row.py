"""Spark's UnsafeRow, decoded without a JVM: the key and value bytes of a state store, read with the
Spark schema (JSON, as manifests record it) into Python values and Arrow.

An UnsafeRow of n fields is a null bitset (a 64-bit word per 64 fields), then an 8-byte slot per
field, then a variable-length region. A fixed-width value (numbers, dates, timestamps, decimals of
up to 18 digits) sits in its slot, little-endian; any other value's slot holds its offset from the
row's start (high 32 bits) and its size (low 32 bits). Arrays (UnsafeArrayData) are an 8-byte count,
a null bitset, then elements of their type's width (8-byte offset-and-size slots for variable-length
elements, offsets from the array's start); maps (UnsafeMapData) are the key array's size, the key
array, then the value array.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import re
import struct
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ..store.manifest import KEY_ENCODING_FAMILIES, KEY_ENCODING_PREFIX, KEY_ENCODING_RAW

_EPOCH_DATE = dt.date(1970, 1, 1)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_EPOCH_NAIVE = dt.datetime(1970, 1, 1)
_DECIMAL = re.compile(r"^decimal\((\d+),\s*(-?\d+)\)$")
_COLLATED_STRING = re.compile(r"^string collate \S+$")
_DAY_TIME = re.compile(r"^interval (day|hour|minute|second)( to (day|hour|minute|second))?$")
_YEAR_MONTH = re.compile(r"^interval (year|month)( to (year|month))?$")
MAX_LONG_DECIMAL_DIGITS = 18  # up to this precision a decimal's unscaled value sits in its slot

# Fixed-width types: (struct format, width inside an array). In a row every slot is 8 bytes.
_FIXED = {
    "boolean": ("<?", 1),
    "byte": ("<b", 1),
    "short": ("<h", 2),
    "integer": ("<i", 4),
    "date": ("<i", 4),
    "float": ("<f", 4),
    "long": ("<q", 8),
    "timestamp": ("<q", 8),
    "timestamp_ntz": ("<q", 8),
    "double": ("<d", 8),
    "day-time interval": ("<q", 8),
    "year-month interval": ("<i", 4),
}


class SchemaError(ValueError):
    """A schema this decoder cannot use (the caller names the store and version)."""


class UnsupportedTypeError(SchemaError):
    """A schema holds a type this decoder does not read."""


@dataclass(frozen=True)
class SparkType:
    """One Spark SQL type, parsed from its JSON form."""

    name: str  # a _FIXED name, "decimal", "string", "binary", "null", "struct", "array", "map", "calendarinterval"
    precision: int = 0
    scale: int = 0
    fields: tuple[tuple[str, SparkType, bool], ...] = ()  # struct: (name, type, nullable)
    element: SparkType | None = None  # array element; map key
    value: SparkType | None = None  # map value
    contains_null: bool = True

    @property
    def fixed_width(self) -> bool:
        return self.name in _FIXED or (self.name == "decimal" and self.precision <= MAX_LONG_DECIMAL_DIGITS)

    def array_element_width(self) -> int:
        if self.name in _FIXED:
            return _FIXED[self.name][1]
        return 8  # long decimals and offset-and-size slots

    def to_arrow(self) -> pa.DataType:
        simple = {
            "boolean": pa.bool_(),
            "byte": pa.int8(),
            "short": pa.int16(),
            "integer": pa.int32(),
            "long": pa.int64(),
            "float": pa.float32(),
            "double": pa.float64(),
            "date": pa.date32(),
            "timestamp": pa.timestamp("us", tz="UTC"),
            "timestamp_ntz": pa.timestamp("us"),
            "day-time interval": pa.duration("us"),
            "year-month interval": pa.int32(),  # months
            "string": pa.string(),
            "binary": pa.binary(),
            "null": pa.null(),
            "calendarinterval": pa.month_day_nano_interval(),
        }
        if self.name in simple:
            return simple[self.name]
        if self.name == "decimal":
            return pa.decimal128(self.precision, self.scale)
        if self.name == "struct":
            return pa.struct([pa.field(n, t.to_arrow(), nullable) for n, t, nullable in self.fields])
        if self.name == "array":
            assert self.element is not None
            return pa.list_(pa.field("element", self.element.to_arrow(), self.contains_null))
        assert self.name == "map" and self.element is not None and self.value is not None
        return pa.map_(self.element.to_arrow(), pa.field("value", self.value.to_arrow(), self.contains_null))


def parse_type(doc: Any) -> SparkType:
    """A Spark type from its JSON form (`DataType.json`): a name, or an object for structs, arrays,
    maps and user-defined types (read as their SQL type)."""
    if isinstance(doc, str):
        name = doc.strip()
        if name in _FIXED or name in ("string", "binary", "calendarinterval"):
            return SparkType(name)
        if name in ("null", "void"):
            return SparkType("null")
        if _COLLATED_STRING.match(name) or name.startswith(("char(", "varchar(")):
            return SparkType("string")
        if name == "decimal":
            return SparkType("decimal", precision=10, scale=0)
        if m := _DECIMAL.match(name):
            return SparkType("decimal", precision=int(m.group(1)), scale=int(m.group(2)))
        if _DAY_TIME.match(name):
            return SparkType("day-time interval")
        if _YEAR_MONTH.match(name):
            return SparkType("year-month interval")
        raise UnsupportedTypeError(f"Spark type {name!r} cannot be decoded without Spark")
    if isinstance(doc, dict):
        kind = doc.get("type")
        if kind == "struct":
            return SparkType(
                "struct",
                fields=tuple(
                    (str(f["name"]), parse_type(f["type"]), bool(f.get("nullable", True)))
                    for f in doc.get("fields", [])
                ),
            )
        if kind == "array":
            return SparkType(
                "array", element=parse_type(doc["elementType"]), contains_null=bool(doc.get("containsNull", True))
            )
        if kind == "map":
            return SparkType(
                "map",
                element=parse_type(doc["keyType"]),
                value=parse_type(doc["valueType"]),
                contains_null=bool(doc.get("valueContainsNull", True)),
            )
        if kind == "udt" and "sqlType" in doc:
            return parse_type(doc["sqlType"])
    raise UnsupportedTypeError(f"Spark type {json.dumps(doc)[:200]} cannot be decoded without Spark")


def parse_schema(schema_json: str) -> SparkType:
    """The struct type of a state store's keys or values, from the schema JSON a manifest records."""
    try:
        doc = json.loads(schema_json)
    except json.JSONDecodeError as e:
        raise SchemaError(f"the schema {schema_json[:200]!r} is not Spark schema JSON ({e})") from None
    t = parse_type(doc)
    if t.name != "struct":
        raise SchemaError(f"a state schema must be a struct, not {schema_json[:200]}")
    return t


class RowDecodeError(ValueError):
    """Bytes that are not an UnsafeRow of the schema (the schema does not match the state)."""


def bitset_bytes(n: int) -> int:
    return ((n + 63) // 64) * 8


def _is_null(buf: memoryview, bitset_at: int, i: int) -> bool:
    return bool(buf[bitset_at + (i >> 6) * 8 + ((i & 63) >> 3)] & (1 << (i & 7)))


def _offset_and_size(buf: memoryview, at: int, base: int, end: int) -> tuple[int, int]:
    packed = int.from_bytes(buf[at : at + 8], "little")
    offset, size = base + (packed >> 32), packed & 0xFFFFFFFF
    if offset < base or offset + size > end:
        raise RowDecodeError(f"a value at {offset - base}+{size} lies outside its {end - base}-byte row")
    return offset, size


def _fixed(t: SparkType, buf: memoryview, at: int) -> Any:
    if t.name == "decimal":
        return decimal.Decimal(struct.unpack_from("<q", buf, at)[0]).scaleb(-t.scale)
    raw = struct.unpack_from(_FIXED[t.name][0], buf, at)[0]
    if t.name == "date":
        return _EPOCH_DATE + dt.timedelta(days=raw)
    if t.name == "timestamp":
        return _EPOCH + dt.timedelta(microseconds=raw)
    if t.name == "timestamp_ntz":
        return _EPOCH_NAIVE + dt.timedelta(microseconds=raw)
    if t.name == "day-time interval":
        return dt.timedelta(microseconds=raw)
    return raw


def _variable(t: SparkType, buf: memoryview, offset: int, size: int) -> Any:
    if t.name == "string":
        return bytes(buf[offset : offset + size]).decode("utf-8", errors="replace")
    if t.name == "binary":
        return bytes(buf[offset : offset + size])
    if t.name == "decimal":
        unscaled = int.from_bytes(buf[offset : offset + size], "big", signed=True)
        return decimal.Decimal(unscaled).scaleb(-t.scale)
    if t.name == "struct":
        return _row(t, buf, offset, offset + size)
    if t.name == "array":
        return _array(t, buf, offset, offset + size)
    if t.name == "map":
        return _map(t, buf, offset, offset + size)
    if t.name == "calendarinterval":
        months, days, micros = struct.unpack_from("<iiq", buf, offset)
        return (months, days, micros * 1000)
    raise UnsupportedTypeError(f"Spark type {t.name} cannot be decoded without Spark")


def _row(t: SparkType, buf: memoryview, base: int, end: int) -> tuple[Any, ...]:
    n = len(t.fields)
    slots = base + bitset_bytes(n)
    if slots + 8 * n > end:
        raise RowDecodeError(f"{end - base} bytes cannot hold a row of {n} fields")
    out: list[Any] = []
    for i, (_, ft, _) in enumerate(t.fields):
        at = slots + 8 * i
        if ft.name == "null" or _is_null(buf, base, i):
            out.append(None)
        elif ft.fixed_width:
            out.append(_fixed(ft, buf, at))
        else:
            out.append(_variable(ft, buf, *_offset_and_size(buf, at, base, end)))
    return tuple(out)


def _array(t: SparkType, buf: memoryview, base: int, end: int) -> list[Any]:
    assert t.element is not None
    n = struct.unpack_from("<q", buf, base)[0]
    width = t.element.array_element_width()
    values = base + 8 + bitset_bytes(n)
    if n < 0 or values + n * width > end:
        raise RowDecodeError(f"{end - base} bytes cannot hold an array of {n} elements")
    out: list[Any] = []
    et = t.element
    for i in range(n):
        at = values + i * width
        if et.name == "null" or _is_null(buf, base + 8, i):
            out.append(None)
        elif et.fixed_width:
            out.append(_fixed(et, buf, at))
        else:
            out.append(_variable(et, buf, *_offset_and_size(buf, at, base, end)))
    return out


def _map(t: SparkType, buf: memoryview, base: int, end: int) -> list[tuple[Any, Any]]:
    assert t.element is not None and t.value is not None
    key_bytes = struct.unpack_from("<q", buf, base)[0]
    keys_at = base + 8
    if key_bytes < 0 or keys_at + key_bytes > end:
        raise RowDecodeError(f"{end - base} bytes cannot hold a map whose keys take {key_bytes}")
    keys = _array(SparkType("array", element=t.element), buf, keys_at, keys_at + key_bytes)
    values = _array(SparkType("array", element=t.value), buf, keys_at + key_bytes, end)
    if len(keys) != len(values):
        raise RowDecodeError(f"a map with {len(keys)} keys and {len(values)} values")
    return list(zip(keys, values, strict=True))


def decode_row(t: SparkType, data: bytes | memoryview) -> tuple[Any, ...]:
    """One UnsafeRow of struct type `t` as a tuple of Python values, nested structs as tuples and
    maps as lists of pairs: what Arrow takes. Positional, because Spark's schemas repeat field
    names (an aggregation's buffer holds a `sum` and a `count` per aggregate)."""
    buf = memoryview(data)
    if len(buf) % 8:
        raise RowDecodeError(f"an UnsafeRow is a whole number of 8-byte words, not {len(buf)} bytes")
    return _row(t, buf, 0, len(buf))


def java_big_integer_bytes(unscaled: int) -> bytes:
    """Java's BigInteger.toByteArray: the shortest big-endian two's complement, at least one byte."""
    bit_length = (~unscaled if unscaled < 0 else unscaled).bit_length()
    return unscaled.to_bytes(bit_length // 8 + 1, "big", signed=True)


def unscaled_of(t: SparkType, value: Any) -> int:
    """A decimal's unscaled integer, checked against the type's precision and scale."""
    scaled = decimal.Decimal(value).scaleb(t.scale)
    if scaled != scaled.to_integral_value():
        raise ValueError(f"{value} has more than the {t.scale} decimal places of decimal({t.precision},{t.scale})")
    unscaled = int(scaled)
    if len(str(abs(unscaled))) > t.precision:
        raise ValueError(f"{value} does not fit decimal({t.precision},{t.scale})")
    return unscaled


def epoch_number(type_name: str, value: Any) -> int:
    """The number Spark stores (and hashes) for a date (days since 1970-01-01), a timestamp
    (microseconds since the epoch) or a day-time interval (microseconds)."""
    if type_name == "date":
        return (value - _EPOCH_DATE).days
    if type_name == "day-time interval":
        delta = value
    else:
        delta = value - (_EPOCH if type_name == "timestamp" else _EPOCH_NAIVE)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _fixed_bytes(t: SparkType, value: Any) -> bytes:
    """A fixed-width value's bytes, as Spark's UnsafeWriter puts them in an 8-byte slot."""
    if t.name == "decimal":
        return struct.pack("<q", unscaled_of(t, value))
    if t.name in ("date", "timestamp", "timestamp_ntz", "day-time interval"):
        value = epoch_number(t.name, value)
    elif t.name in ("float", "double") and value == 0.0:
        value = 0.0  # Spark normalizes -0.0 in keys
    return struct.pack(_FIXED[t.name][0], value)


def encode_row(t: SparkType, values: tuple[Any, ...] | list[Any]) -> bytes:
    """The UnsafeRow Spark writes for `values` (as `decode_row` returns them: nested structs as
    tuples) byte for byte, so it can be looked up in a store: padding and unused slot bytes are
    zero, strings are padded to whole words, NaN and -0.0 normalized. Numbers, strings, binary,
    decimals, dates, timestamps, intervals and nested structs; arrays and maps raise
    UnsupportedTypeError."""
    n = len(t.fields)
    if len(values) != n:
        raise ValueError(f"a row of {n} fields cannot hold {len(values)} values")
    fixed = bytearray(bitset_bytes(n) + 8 * n)
    variable = bytearray()
    slots = bitset_bytes(n)

    def set_null(i: int) -> None:
        fixed[(i >> 6) * 8 + ((i & 63) >> 3)] |= 1 << (i & 7)

    for i, ((_, ft, _), value) in enumerate(zip(t.fields, values, strict=True)):
        at = slots + 8 * i
        if ft.name == "decimal" and not ft.fixed_width:
            # UnsafeRowWriter reserves 16 zeroed bytes for a long decimal, null or not
            offset = len(fixed) + len(variable)
            data = b"" if value is None else java_big_integer_bytes(unscaled_of(ft, value))
            if len(data) > 16:
                raise ValueError(f"{value} does not fit decimal({ft.precision},{ft.scale})")
            variable += data + bytes(16 - len(data))
            if value is None:
                set_null(i)
            fixed[at : at + 8] = ((offset << 32) | len(data)).to_bytes(8, "little")
        elif value is None or ft.name == "null":
            set_null(i)
        elif ft.fixed_width:
            data = _fixed_bytes(ft, value)
            fixed[at : at + len(data)] = data
        else:
            if ft.name == "string":
                data = value.encode("utf-8")
            elif ft.name == "binary":
                data = bytes(value)
            elif ft.name == "struct":
                data = encode_row(ft, value)
            else:
                raise UnsupportedTypeError(f"Spark type {ft.name} cannot be encoded without Spark")
            offset = len(fixed) + len(variable)
            variable += data + bytes(-len(data) % 8)
            fixed[at : at + 8] = ((offset << 32) | len(data)).to_bytes(8, "little")
    return bytes(fixed + variable)


def key_row_bytes(key: bytes, key_encoding: str) -> memoryview:
    """The key's UnsafeRow within a stored key (a prefix-scan store's keys carry the prefix row first)."""
    buf = memoryview(key)
    if key_encoding == KEY_ENCODING_RAW:
        return buf
    if key_encoding == KEY_ENCODING_PREFIX:
        prefix = int.from_bytes(buf[:4], "big")
        if 4 + prefix > len(buf):
            raise RowDecodeError(f"a prefix-encoded key of {len(buf)} bytes says its prefix takes {prefix}")
        return buf[4 + prefix :]
    if key_encoding == KEY_ENCODING_FAMILIES:
        raise SchemaError(
            "this store has column families (transformWithState); the offline tools do not read them yet: "
            "read each state variable with spark.read.format('statestore').option('stateVarName', NAME)"
        )
    raise SchemaError(f"unknown key encoding {key_encoding!r}")


def unique_names(names: list[str]) -> list[str]:
    """Field names with repeats numbered, as the tools show them: sum, count, sum#2, count#2."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return out


class StateRowDecoder:
    """Decodes a store's stored (key, value) pairs with the schemas and key encoding of its manifest."""

    def __init__(self, key_schema: str, value_schema: str, key_encoding: str = KEY_ENCODING_RAW) -> None:
        self.key_schema = key_schema
        self.key_type = parse_schema(key_schema)
        self.value_type = parse_schema(value_schema)
        self.key_encoding = key_encoding

    def key(self, stored_key: bytes) -> tuple[Any, ...]:
        return decode_row(self.key_type, key_row_bytes(stored_key, self.key_encoding))

    def value(self, stored_value: bytes) -> tuple[Any, ...]:
        return decode_row(self.value_type, stored_value)

    @property
    def key_names(self) -> list[str]:
        return [name for name, _, _ in self.key_type.fields]

    def arrow_schema(self) -> pa.Schema:
        """What `spark.read.format("statestore")` shows: key and value structs, and the partition."""
        return pa.schema(
            [
                pa.field("key", self.key_type.to_arrow()),
                pa.field("value", self.value_type.to_arrow()),
                pa.field("partition_id", pa.int32(), nullable=False),
            ]
        )
