"""Point lookups of state keys (`pystatestore read --key`): the seeds' queryable state, served from
a checkpoint. A key that names every key column is encoded as the UnsafeRow Spark stored, sent to
the partition Spark's hash partitioning gives it, and read with one get from that partition's
store alone. Keys that name only some columns, and stores whose key is not the partitioning key,
are found by a scan of every partition instead; `plan_lookup` says which and why.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import decimal
from dataclasses import dataclass, field
from typing import Any

from ..store.errors import StoreConfigError
from ..store.manifest import KEY_ENCODING_RAW
from .checkpoint import DEFAULT_STORE_NAME, SparkCheckpoint, StoreLocation
from .spark_hash import partition_of
from .unsafe_row import SparkType, UnsupportedTypeError, encode_row, parse_schema, unique_names

SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
# Stores whose key is exactly the operator's partitioning key. A join's keyWithIndexToValue store
# adds an index to the join key, and other stores (transformWithState's, session windows' prefix
# keys) key by more than the partitioning columns: those are scanned.
_LOOKUP_STORES = (DEFAULT_STORE_NAME, "left-keyToNumValues", "right-keyToNumValues")


class KeyValueError(ValueError):
    """A --key value that cannot be a value of its key column's type."""


@dataclass
class LookupPlan:
    """Where to read: the stored key bytes per partition for a lookup, or why a scan is needed."""

    by_partition: dict[int, list[bytes]] = field(default_factory=dict)
    scan_reason: str = ""

    @property
    def is_lookup(self) -> bool:
        return not self.scan_reason


def num_partitions(ckpt: SparkCheckpoint, locations: list[StoreLocation]) -> int | None:
    """The operator's partition count: the shuffle partitions the query's offsets record (Spark
    keeps that value for the checkpoint's life), checked against the store directories."""
    ids = {loc.partition_id for loc in locations}
    try:
        n = int(ckpt.conf[SHUFFLE_PARTITIONS])
    except (KeyError, ValueError):
        n = len(ids)
        return n if ids == set(range(n)) else None
    return n if ids <= set(range(n)) else None


class ScanNeededError(Exception):
    """A key that cannot be looked up in one partition: the reason says why, and a scan finds it."""


class KeyRouter:
    """Where a whole key of a store lives: the partition Spark's hash partitioning sends it to, and the
    bytes the store keeps it under (`prefix` + its UnsafeRow). Built once per store name and schema, so
    a service can route each question without re-reading schemas."""

    def __init__(self, key_schema: str, num_partitions: int, prefix: bytes = b"") -> None:
        if "collate" in key_schema.lower():
            raise ScanNeededError("a key column has a collation, which changes how Spark hashes it")
        self.key_type = parse_schema(key_schema)
        self.names = unique_names([name for name, _, _ in self.key_type.fields])  # as `read -o -` prints them
        self.num_partitions = num_partitions
        self.prefix = prefix

    def route(self, key: dict[str, Any]) -> tuple[int, bytes]:
        """(partition, stored key) of `key`, a JSON object of every key column. KeyValueError for a
        value its column cannot hold; ScanNeededError for a key naming only some columns or a type the
        hash or the encoder here does not cover."""
        if set(key) != set(self.names):
            raise ScanNeededError(f"a key must name every key column ({', '.join(self.names)}) to be looked up")
        values = tuple(
            from_json(t, key[name], name) for name, (_, t, _) in zip(self.names, self.key_type.fields, strict=True)
        )
        try:
            return partition_of(self.key_type, values, self.num_partitions), self.prefix + encode_row(
                self.key_type, values
            )
        except UnsupportedTypeError as e:
            raise ScanNeededError(str(e)) from None


def router_for(ckpt: SparkCheckpoint, locations: list[StoreLocation], key_schema: str, key_encoding: str) -> KeyRouter:
    """The router of the stores `locations` (one store name of one operator); ScanNeededError when their
    keys cannot be looked up by partition."""
    store_name = locations[0].store_name
    if store_name not in _LOOKUP_STORES:
        raise ScanNeededError(f"the keys of store '{store_name}' are not its operator's partitioning key")
    if key_encoding != KEY_ENCODING_RAW:
        raise ScanNeededError(f"the store's keys are encoded as {key_encoding} (a prefix scan store)")
    n = num_partitions(ckpt, locations)
    if n is None:
        raise ScanNeededError("the checkpoint's partition count is unclear")
    return KeyRouter(key_schema, n)


def plan_lookup(
    ckpt: SparkCheckpoint,
    locations: list[StoreLocation],
    key_schema: str,
    key_encoding: str,
    keys: list[dict[str, Any]],
) -> LookupPlan:
    """How to find `keys` (JSON objects of key fields) among the stores `locations` of one store name."""
    try:
        router = router_for(ckpt, locations, key_schema, key_encoding)
        routed = [router.route(key) for key in keys]
    except ScanNeededError as e:
        return LookupPlan(scan_reason=str(e))
    plan = LookupPlan()
    for partition, row in routed:
        plan.by_partition.setdefault(partition, []).append(row)
    return plan


def from_json(t: SparkType, value: Any, name: str) -> Any:
    """A key column's value given as JSON, as `read -o -` prints it (dates and timestamps as ISO
    text, binary as hex, decimals as numbers or text, intervals in seconds), as the decoder's
    Python value."""
    if value is None:
        return None
    try:
        return _from_json(t, value, name)
    except (ValueError, TypeError, decimal.InvalidOperation, binascii.Error) as e:
        raise KeyValueError(f"key column '{name}' is {_type_name(t)}; {value!r} is not one ({e})") from None


def _from_json(t: SparkType, value: Any, name: str) -> Any:
    kind = t.name
    if kind == "boolean":
        if not isinstance(value, bool):
            raise TypeError("give true or false")
        return value
    if kind in ("byte", "short", "integer", "long", "year-month interval"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError("give a whole number")
        bits = {"byte": 8, "short": 16, "integer": 32, "year-month interval": 32, "long": 64}[kind]
        if not -(1 << (bits - 1)) <= value < (1 << (bits - 1)):
            raise ValueError(f"out of range for {bits} bits")
        return value
    if kind in ("float", "double"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError("give a number")
        return float(value)
    if kind == "decimal":
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise TypeError("give a number or its text")
        return decimal.Decimal(str(value))
    if kind == "string":
        if not isinstance(value, str):
            raise TypeError("give text")
        return value
    if kind == "binary":
        if not isinstance(value, str):
            raise TypeError("give hex text, as `read -o -` prints it, or base64: prefixed")
        return base64.b64decode(value[7:], validate=True) if value.startswith("base64:") else bytes.fromhex(value)
    if kind == "date":
        return dt.date.fromisoformat(value)
    if kind in ("timestamp", "timestamp_ntz"):
        parsed = dt.datetime.fromisoformat(value)
        if kind == "timestamp_ntz":
            return parsed.replace(tzinfo=None)
        return (parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc)).astimezone(dt.timezone.utc)
    if kind == "day-time interval":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError("give seconds")
        return dt.timedelta(seconds=value)
    if kind == "struct":
        fields = t.fields
        names = unique_names([n for n, _, _ in fields])
        if isinstance(value, dict):
            if set(value) != set(names):
                raise ValueError(f"give every field: {', '.join(names)}")
            return tuple(from_json(ft, value[fn], f"{name}.{fn}") for fn, (_, ft, _) in zip(names, fields, strict=True))
        if isinstance(value, list) and len(value) == len(fields):
            return tuple(from_json(ft, v, f"{name}.{fn}") for (fn, ft, _), v in zip(fields, value, strict=True))
        raise TypeError("give an object of its fields")
    raise UnsupportedTypeError(f"key column '{name}' is {_type_name(t)}, which a lookup cannot encode")


def _type_name(t: SparkType) -> str:
    return f"decimal({t.precision},{t.scale})" if t.name == "decimal" else t.name


def lookup_error(e: KeyValueError, store: str) -> StoreConfigError:
    return StoreConfigError(
        str(e), store=store, advice='Give the key as `read -o -` prints it, e.g. --key \'{"day": "2026-01-01"}\'.'
    )


__all__ = [
    "KeyRouter",
    "KeyValueError",
    "LookupPlan",
    "ScanNeededError",
    "from_json",
    "lookup_error",
    "num_partitions",
    "plan_lookup",
    "router_for",
]
