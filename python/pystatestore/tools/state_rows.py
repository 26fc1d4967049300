"""A checkpoint's state rows, decoded: `pystatestore read` (every row of a store's version, or the
rows of given keys, looked up in the one partition Spark would route them to). Nothing here writes
into a checkpoint."""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pyarrow as pa

from ..reading.checkpoint import SparkCheckpoint, StoreLocation
from ..reading.decoded import key_matches
from ..reading.families import Family, family_prefix, registry
from ..reading.key_lookup import KeyValueError, lookup_error, plan_lookup
from ..reading.store_reader import StoreReader
from ..reading.unsafe_row import RowDecodeError, SchemaError, StateRowDecoder, unique_names
from ..store.errors import StateStoreError
from ..store.manifest import KEY_ENCODING_FAMILIES
from .inspection import Progress, _no_progress


def read_state(
    ckpt: SparkCheckpoint,
    *,
    operator: int = 0,
    store_name: str = "default",
    batch: int | None = None,
    partitions: Iterable[int] | None = None,
    keys: list[dict[str, Any]] | None = None,
    family: str | None = None,
    progress: Progress = _no_progress,
    notice: Callable[[str], None] = lambda message: None,
) -> pa.Table:
    """The state rows of `batch` (default: the last committed) of an operator's store, decoded:
    columns key, value (structs of the store's schemas) and partition_id, as
    `spark.read.format("statestore")` shows them. `keys`: only rows whose key has these fields; a
    key naming every key column is looked up in the one partition Spark sends it to (`notice`
    says whether keys were looked up or scanned for, and why). `family`: the column family (a
    transformWithState state variable) of a store with column families, a list's values one row each;
    its keys are scanned for."""
    version = ckpt.version_of_batch(batch)
    wanted = set(partitions) if partitions is not None else None
    of_store = [s for s in ckpt.stores_of(operator) if s.store_name == store_name]
    locations = [s for s in of_store if wanted is None or s.partition_id in wanted]
    if not locations:
        names = sorted({(s.operator_id, s.store_name) for s in ckpt.stores})
        raise StateStoreError(
            f"the checkpoint has no store '{store_name}' of operator {operator}",
            store=ckpt.uri,
            advice=f"Its stores (operator, name): {names}. Pass --operator and --store-name.",
        )
    if family is not None or _has_families(locations[0], version):
        return _read_family(locations, version, progress, family, keys)
    if keys is not None:
        with StoreReader(locations[0]) as first:
            decoder = _decoder(first, locations[0], version)
        try:
            plan = plan_lookup(ckpt, of_store, decoder.key_schema, decoder.key_encoding, keys)
        except KeyValueError as e:
            raise lookup_error(e, ckpt.uri) from None
        if plan.is_lookup:
            locations = [s for s in locations if s.partition_id in plan.by_partition]
            if not locations:  # the keys' partitions are not among those asked for
                return decoder.arrow_schema().empty_table()
            notice(
                f"looked up {len(keys)} key(s) in {len(locations)} of {len(of_store)} partitions "
                "(the ones Spark's hash partitioning sends them to)"
            )
            return _read_stores(
                locations, version, progress, lambda reader, loc: _looked_up(reader, version, plan.by_partition[loc])
            )
        notice(f"scanning every partition for the key: {plan.scan_reason}")
    return _read_stores(locations, version, progress, lambda reader, loc: reader.state_pairs(version), keys)


def _looked_up(reader: StoreReader, version: int, stored_keys: list[bytes]) -> Iterator[tuple[bytes, bytes]]:
    for k, v in zip(stored_keys, reader.get(version, stored_keys), strict=True):
        if v is not None:
            yield k, v


def _has_families(loc: StoreLocation, version: int) -> bool:
    with StoreReader(loc) as reader:
        return reader.schemas(version)[2] == KEY_ENCODING_FAMILIES


def _read_family(
    locations: list[StoreLocation],
    version: int,
    progress: Progress,
    family: str | None,
    keys: list[dict[str, Any]] | None,
) -> pa.Table:
    """The rows of column family `family` of each store, decoded with the schemas its registry records."""
    found: set[str] = set()
    parts: list[tuple[StoreLocation, Family, list[tuple[memoryview, memoryview]]]] = []
    for i, loc in enumerate(locations):
        progress("reading state", i, len(locations))
        with StoreReader(loc, progress=progress) as reader:
            if reader.schemas(version)[2] != KEY_ENCODING_FAMILIES:
                raise StateStoreError(
                    "this store has no column families (it is not a transformWithState store)",
                    store=loc.uri,
                    version=version,
                    advice="Leave out --family.",
                )
            pairs = list(reader.state_pairs(version))
        families = registry(pairs)
        found |= families.keys()
        f = families.get(family) if family is not None else None
        if f is None:
            continue  # this partition never declared it: no rows here
        prefix = family_prefix(f.family_id)
        rows = [(f.key_row(k), v) for k, value in pairs if k.startswith(prefix) for v in f.values(value)]
        parts.append((loc, f, rows))
    progress("reading state", len(locations), len(locations))
    if not parts:
        what = f"no column family {family!r}" if family is not None else "column families (transformWithState)"
        raise StateStoreError(
            f"this store has {what}; its families: {', '.join(sorted(found)) or 'none'}",
            store=locations[0].uri,
            version=version,
            advice="Pass --family NAME, NAME a state variable of the processor (timers and TTL indexes are "
            "families too, with names starting with $).",
        )
    tables = []
    for loc, f, rows in parts:
        decoder = StateRowDecoder(f.key_schema, f.value_schema)
        tables.append(_decoded_table(loc, version, decoder, rows, keys, f"column family {f.name}"))
    return pa.concat_tables(tables)


def _decoded_table(
    loc: StoreLocation,
    version: int,
    decoder: StateRowDecoder,
    pairs: Iterable[tuple[bytes | memoryview, bytes | memoryview]],
    keys: list[dict[str, Any]] | None,
    file: str,
) -> pa.Table:
    """`pairs` decoded as rows of `loc`: key, value, partition_id (keys filtered to `keys`)."""
    schema = decoder.arrow_schema()
    rows_k, rows_v = [], []
    names = unique_names(decoder.key_names)
    for k, v in pairs:
        try:
            key = decoder.key(k)
            if keys is not None and not key_matches(dict(zip(names, key, strict=True)), keys):
                continue
            value = decoder.value(v)
        except (RowDecodeError, struct.error) as e:
            raise StateStoreError(
                f"a state row does not decode with the schemas the manifests record ({e}; key {bytes(k[:32]).hex()})",
                store=loc.uri,
                version=version,
                file=file,
                advice="The state was written with other schemas than the manifests say; nothing was changed. "
                'Read it with spark.read.format("statestore").',
            ) from None
        rows_k.append(key)
        rows_v.append(value)
    return pa.table(
        {
            "key": pa.array(rows_k, schema.field("key").type),
            "value": pa.array(rows_v, schema.field("value").type),
            "partition_id": pa.array([loc.partition_id] * len(rows_k), pa.int32()),
        },
        schema=schema,
    )


def _read_stores(
    locations: list[StoreLocation],
    version: int,
    progress: Progress,
    pairs_of: Callable[[StoreReader, int], Iterable[tuple[bytes, bytes]]],
    keys: list[dict[str, Any]] | None = None,
) -> pa.Table:
    """The decoded rows `pairs_of(reader, partition)` yields from each store, as one table."""
    tables = []
    for i, loc in enumerate(locations):
        progress("reading state", i, len(locations))
        with StoreReader(loc, progress=progress) as reader:
            decoder = _decoder(reader, loc, version)
            file = reader.manifest(version).path
            tables.append(_decoded_table(loc, version, decoder, pairs_of(reader, loc.partition_id), keys, file))
    progress("reading state", len(locations), len(locations))
    return pa.concat_tables(tables)


def _decoder(reader: StoreReader, loc: StoreLocation, version: int) -> StateRowDecoder:
    try:
        return StateRowDecoder(*reader.schemas(version))
    except SchemaError as e:
        raise StateStoreError(
            f"the state cannot be decoded without Spark: {e}",
            store=loc.uri,
            version=version,
            file=reader.manifest(version).path,
            advice='Read it with spark.read.format("statestore"). Nothing was changed.',
        ) from None


__all__ = ["read_state"]
