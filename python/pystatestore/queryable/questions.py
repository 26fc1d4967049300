"""Answering questions from one served batch: a key routed to the partition Spark's hash partitioning
sends it to and read there, or scanned for across every partition; values decoded from Spark's
UnsafeRow, a transformWithState variable's through its family's registry entry."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..reading.decoded import key_matches
from ..reading.families import Family, family_prefix
from ..reading.key_lookup import KeyValueError, ScanNeededError, router_for
from ..reading.unsafe_row import RowDecodeError, SchemaError, SparkType, decode_row, key_row_bytes, unique_names
from ..store.errors import StateStoreError
from ..store.manifest import KEY_ENCODING_FAMILIES
from .answers import Answer, Lookup, QuestionError, Scan
from .key_filter import key_prefilter
from .layout import Layout, Shape
from .paging import ScanCursor, ScanPosition, encode_cursor
from .served import ServedBatch, StoreId
from .values import row_json
from .versions import OpenVersion


class Questions:
    """The questions of a checkpoint's client: `layout()` gives the checkpoint as last read, `view`
    a store's open version at a served batch (opened on first use)."""

    def __init__(
        self, uri: str, layout: Callable[[], Layout], view: Callable[[ServedBatch, StoreId], OpenVersion]
    ) -> None:
        self.uri, self.layout, self.view = uri, layout, view

    def partitions_of(self, operator: int, store: str) -> list[int]:
        parts = sorted(
            s.partition_id for s in self.layout().ckpt.stores_of(operator) if s.store_name == store and not s.foreign
        )
        if not parts:
            known = sorted({(s.operator_id, s.store_name) for s in self.layout().ckpt.stores})
            raise self._question(
                f"the checkpoint has no store '{store}' of operator {operator}; its stores (operator, name): {known}"
            )
        return parts

    def shape(self, served: ServedBatch, operator: int, store: str, family_name: str | None) -> Shape:
        """How to find keys of `store` (its first partition opened once per layout to learn it)."""
        layout = self.layout()
        cache_key = (operator, store, family_name)
        shape = layout.shapes.get(cache_key)
        if shape is not None:
            return shape
        partitions = self.partitions_of(operator, store)
        first = self.view(served, (operator, partitions[0], store))
        family = self.family(first, family_name, store)
        locations = [s for s in layout.ckpt.stores_of(operator) if s.store_name == store]
        try:
            if family is None:
                router = router_for(layout.ckpt, locations, first.key_schema, first.key_encoding)
            elif family.key_encoding != "raw":
                raise ScanNeededError(
                    f"state variable {family.name} keys by more than the grouping key ({family.key_encoding})"
                )
            else:
                router = router_for(layout.ckpt, locations, family.key_schema, "raw")
            shape = Shape(router, "", family)
        except ScanNeededError as e:
            shape = Shape(None, str(e), family)
        layout.shapes[cache_key] = shape
        return shape

    def lookup(
        self, served: ServedBatch, keys: list[dict[str, Any]], operator: int, store: str, family_name: str | None
    ) -> Lookup:
        shape = self.shape(served, operator, store, family_name)
        family = shape.family
        try:
            if shape.router is None:
                raise ScanNeededError(shape.scan_reason)
            routed = [shape.router.route(k) for k in keys]
        except KeyValueError as e:
            raise self._question(str(e)) from None
        except ScanNeededError:
            # Keys that are not their store's partitioning key: found by a scan of every partition.
            return Lookup(served.batch, [self._found_by_scan(served, k, operator, store, family_name) for k in keys])
        by_partition: dict[int, list[int]] = {}
        for i, (p, _) in enumerate(routed):
            by_partition.setdefault(p, []).append(i)
        results: list[Answer | None] = [None] * len(keys)
        for p, indexes in by_partition.items():
            opened = self.view(served, (operator, p, store))
            stored = [routed[i][1] for i in indexes]
            value_type = opened.type_of(opened.value_schema)
            multiple = False
            if family is not None:
                own = opened.families().get(family.name)
                if own is None:  # this partition never declared the variable: nothing stored under it
                    for i in indexes:
                        results[i] = Answer(served.batch, False, None, p)
                    continue
                prefix = family_prefix(own.family_id)
                stored = [prefix + k for k in stored]
                value_type, multiple = opened.type_of(own.value_schema), own.multiple_values
            for i, raw in zip(indexes, opened.get_many(stored), strict=True):
                value = (
                    None if raw is None else self._decode_value(opened, value_type, raw, family if multiple else None)
                )
                results[i] = Answer(served.batch, raw is not None, value, p)
        return Lookup(served.batch, [r for r in results if r is not None])

    def _found_by_scan(
        self, served: ServedBatch, key: dict[str, Any], operator: int, store: str, family_name: str | None
    ) -> Answer:
        rows = self.scan(served, key, 1, operator, store, family_name, exact=True).rows
        if not rows:
            return Answer(served.batch, False, None, None)
        return Answer(served.batch, True, rows[0]["value"], rows[0]["partition"])

    def scan(
        self,
        served: ServedBatch,
        key: dict[str, Any],
        limit: int,
        operator: int,
        store: str,
        family_name: str | None,
        *,
        exact: bool = False,
        start: ScanPosition | None = None,
        question: str = "",
    ) -> Scan:
        """Up to `limit` rows matching `key`, partition by partition and within one in stored key
        order (after `start`, where the last page ended); with more left, a cursor after the last
        row (`question` names the scan in it). `exact`: a whole key, found once (no cursor)."""
        rows: list[dict[str, Any]] = []
        last: ScanPosition | None = None
        for p in self.partitions_of(operator, store):
            if start is not None and p < start.partition:
                continue
            opened = self.view(served, (operator, p, store))
            family = self.family(opened, family_name, store, missing_ok=True)
            if family_name is not None and family is None:
                continue  # the variable was never declared in this partition
            if family is not None:
                key_type, value_type = opened.type_of(family.key_schema), opened.type_of(family.value_schema)
                prefix = family_prefix(family.family_id)
            else:
                key_type, value_type = opened.type_of(opened.key_schema), opened.type_of(opened.value_schema)
                prefix = b""
            names = unique_names([n for n, _, _ in key_type.fields])
            unknown = set(key) - set(names)
            if unknown:
                raise self._question(
                    f"the key has no column(s) {', '.join(sorted(unknown))}; its columns: {', '.join(names)}"
                )
            if exact and set(key) != set(names):
                raise self._question(f"a key must name every key column ({', '.join(names)})")
            after = start.after if start is not None and p == start.partition else None
            if after is not None and not after.startswith(prefix):
                raise self._question("the cursor does not continue a scan of this store: start again without it")
            may_match = key_prefilter(key_type, names, key) if key else None
            for k, v in opened.items(prefix, after):
                try:
                    row = family.key_row(k) if family is not None else key_row_bytes(k, opened.key_encoding)
                    if may_match is not None and not may_match(row):
                        continue
                    decoded = row_json(key_type, decode_row(key_type, row))
                    if key and not key_matches(decoded, [key]):
                        continue
                    if last is not None and len(rows) >= limit:  # a row past the page: more remain
                        return Scan(served.batch, rows, False, encode_cursor(ScanCursor(served.batch, question, last)))
                    value = self._decode_value(
                        opened, value_type, v, family if family and family.multiple_values else None
                    )
                except (RowDecodeError, SchemaError) as e:
                    raise self._undecodable(opened, e) from None
                rows.append({"key": decoded, "value": value, "partition": p})
                last = ScanPosition(p, k)
                if exact:
                    return Scan(served.batch, rows, True)
        return Scan(served.batch, rows, True)

    def family(self, opened: OpenVersion, name: str | None, store: str, *, missing_ok: bool = False) -> Family | None:
        if not opened.has_families:
            if name is not None:
                raise self._question(f"store '{store}' has no state variables (it is not a transformWithState store)")
            return None
        if name is None:
            raise self._question(
                f"store '{store}' is a transformWithState store: name a state variable (family); its variables: "
                f"{', '.join(sorted(f for f in opened.families() if not f.startswith('$'))) or 'none'}"
            )
        found = opened.families().get(name)
        if found is None and not missing_ok:
            raise self._question(
                f"store '{store}' has no state variable '{name}'; its variables: "
                f"{', '.join(sorted(opened.families())) or 'none'}"
            )
        return found

    def _decode_value(self, opened: OpenVersion, value_type: SparkType, raw: bytes, listing: Family | None) -> Any:
        try:
            if listing is not None:
                return [row_json(value_type, decode_row(value_type, v)) for v in listing.values(raw)]
            return row_json(value_type, decode_row(value_type, raw))
        except (RowDecodeError, SchemaError) as e:
            raise self._undecodable(opened, e) from None

    def _undecodable(self, opened: OpenVersion, e: Exception) -> StateStoreError:
        return StateStoreError(
            f"a state row does not decode with the schemas the manifests record ({e})",
            store=opened.location.uri,
            version=opened.version,
            advice='Nothing was changed. Read it with spark.read.format("statestore").',
        )

    def _question(self, problem: str) -> QuestionError:
        return QuestionError(problem, store=self.uri)


def schema_info(key_schema: str, value_schema: str, key_encoding: str) -> dict[str, Any]:
    import json

    info: dict[str, Any] = {"keySchema": json.loads(key_schema), "valueSchema": json.loads(value_schema)}
    if key_encoding != KEY_ENCODING_FAMILIES:
        info["keyColumns"] = unique_names([f["name"] for f in info["keySchema"].get("fields", [])])
    return info


__all__ = ["Questions", "schema_info"]
