"""Column families of a transformWithState store (key encoding `families-v1`, decision 0027), read
without Spark: each key is a 2-byte big-endian family id, then the key as its family's encoder lays
it out; family 0 is the registry (name -> id, key encoding, several values, schemas). A family with
several values per key stores them as one value: each row a 4-byte big-endian length and its bytes,
zeros up to a multiple of 8."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from .unsafe_row import RowDecodeError, SchemaError, decode_row, parse_schema

REGISTRY_ID = 0
_REGISTRY_KEY = parse_schema(
    json.dumps({"type": "struct", "fields": [{"name": "name", "type": "string", "nullable": False, "metadata": {}}]})
)
_REGISTRY_VALUE = parse_schema(
    json.dumps(
        {
            "type": "struct",
            "fields": [
                {"name": n, "type": t, "nullable": False, "metadata": {}}
                for n, t in (
                    ("id", "integer"),
                    ("keyEncoding", "string"),
                    ("multipleValues", "boolean"),
                    ("keySchema", "string"),
                    ("valueSchema", "string"),
                    ("encoderArgs", "string"),
                )
            ],
        }
    )
)
# Bytes a range-scan family's ordering column takes in front of the key row (a sign or null byte, then
# the value), by Spark type name: what the JVM's RangeKeys writes.
_ORDERED_WIDTH = {
    "boolean": 1,
    "byte": 1,
    "short": 2,
    "integer": 4,
    "date": 4,
    "float": 4,
    "long": 8,
    "timestamp": 8,
    "timestamp_ntz": 8,
    "double": 8,
}


def family_prefix(family_id: int) -> bytes:
    return family_id.to_bytes(2, "big")


@dataclass(frozen=True)
class Family:
    """One column family as the registry records it."""

    name: str
    family_id: int
    key_encoding: str  # raw, prefix-v1 or range-v1: how the key is laid out after the family id
    multiple_values: bool
    key_schema: str
    value_schema: str
    encoder_args: str  # prefix-v1: the number of prefix columns; range-v1: the ordering ordinals

    def key_row(self, stored: bytes) -> memoryview:
        """The key's UnsafeRow inside a stored key of this family."""
        buf = memoryview(stored)[2:]
        if self.key_encoding == "raw":
            return buf
        if self.key_encoding == "prefix-v1":
            prefix = int.from_bytes(buf[:4], "big")
            if 4 + prefix > len(buf):
                raise RowDecodeError(f"a prefix-encoded key of {len(buf)} bytes says its prefix takes {prefix}")
            return buf[4 + prefix :]
        if self.key_encoding == "range-v1":
            return buf[self._ordering_bytes() :]
        raise SchemaError(f"column family {self.name} is stored with unknown key encoding {self.key_encoding!r}")

    def _ordering_bytes(self) -> int:
        fields = json.loads(self.key_schema)["fields"]
        total = 0
        for ordinal in (int(a) for a in self.encoder_args.split(",") if a):
            type_name = fields[ordinal]["type"]
            if not isinstance(type_name, str) or type_name not in _ORDERED_WIDTH:
                raise SchemaError(f"column family {self.name} orders by a {type_name} column")
            total += 1 + _ORDERED_WIDTH[type_name]
        return total

    def values(self, stored: bytes) -> Iterator[memoryview]:
        """The value rows of a stored value: one, or each of a list (several values per key)."""
        buf = memoryview(stored)
        if not self.multiple_values:
            yield buf
            return
        at = 0
        while at + 4 <= len(buf):
            length = int.from_bytes(buf[at : at + 4], "big")
            if length == 0:  # the zero padding after the last value
                return
            if at + 4 + length > len(buf):
                raise RowDecodeError(f"a damaged list of values in column family {self.name} (cut short)")
            yield buf[at + 4 : at + 4 + length]
            at += 4 + length


def registry(pairs: Iterable[tuple[bytes, bytes]]) -> dict[str, Family]:
    """The families a version's registry (family 0) records, from its (key, value) pairs in key order;
    stops at the first key of another family."""
    out: dict[str, Family] = {}
    prefix = family_prefix(REGISTRY_ID)
    for key, value in pairs:
        if not key.startswith(prefix):
            break
        (name,) = decode_row(_REGISTRY_KEY, memoryview(key)[2:])
        if name == "":  # the entry recording the highest id ever given
            continue
        fid, encoding, multiple, key_schema, value_schema, args = decode_row(_REGISTRY_VALUE, value)
        out[name] = Family(name, fid, encoding, multiple, key_schema, value_schema, args)
    return out


@dataclass(frozen=True)
class FamilyCount:
    """How much of a store's state one column family holds."""

    family: Family
    keys: int
    values: int  # a list's values each count; one per key otherwise
    key_bytes: int
    value_bytes: int


def family_counts(pairs: Iterable[tuple[bytes, bytes]]) -> list[FamilyCount]:
    """Keys, values and bytes per family of a version's (key, value) pairs in key order, in family id
    order; families the registry records but holding no key are listed with zeros."""
    pairs = list(pairs)
    families = registry(pairs)
    by_id = {f.family_id: f for f in families.values()}
    tally: dict[int, list[int]] = {fid: [0, 0, 0, 0] for fid in by_id}
    for key, value in pairs:
        fid = int.from_bytes(key[:2], "big")
        if fid == REGISTRY_ID:
            continue
        if fid not in by_id:
            raise SchemaError(f"a key of column family id {fid}, which the store's registry does not record")
        t = tally[fid]
        t[0] += 1
        t[1] += sum(1 for _ in by_id[fid].values(value))
        t[2] += len(key)
        t[3] += len(value)
    return [FamilyCount(by_id[fid], *tally[fid]) for fid in sorted(by_id)]
