"""Decoded state rows as plain values: a key matched against the fields asked for, values as JSON
writes them, an Arrow table's rows with every struct field kept."""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Any

import pyarrow as pa

from .unsafe_row import unique_names


def key_matches(key: dict[str, Any], wanted: list[dict[str, Any]]) -> bool:
    """Whether `key` has the fields of one of `wanted` (values as JSON gives them: dates and
    timestamps as ISO text)."""
    return any(all(f in key and _same(key[f], x) for f, x in want.items()) for want in wanted)


def _same(value: Any, given: Any) -> bool:
    if isinstance(value, (dt.date, dt.datetime)) and isinstance(given, str):
        try:
            parsed = type(value).fromisoformat(given)
        except ValueError:
            return False
        if isinstance(parsed, dt.datetime) and parsed.tzinfo is None and isinstance(value, dt.datetime):
            parsed = parsed.replace(tzinfo=value.tzinfo)
        return bool(parsed == value)
    if isinstance(value, decimal.Decimal) and isinstance(given, (int, float, str)):
        return value == decimal.Decimal(str(given))
    return bool(value == given)


def json_value(v: Any) -> Any:
    """What `json.dumps` writes for a state value it cannot: dates and times as ISO text, intervals in
    seconds, bytes in hex."""
    if isinstance(v, (dt.date, dt.datetime)):
        return v.isoformat()
    if isinstance(v, dt.timedelta):
        return v.total_seconds()
    if isinstance(v, bytes):
        return v.hex()
    return str(v)


def python_rows(table: pa.Table) -> list[dict[str, Any]]:
    """The table's rows as Python values, structs as dicts whose repeated field names get a
    suffix (`sum`, `sum#2`): Arrow's own to_pylist keeps only one of them."""
    columns = {
        name: _python_values(col.combine_chunks()) for name, col in zip(table.schema.names, table.columns, strict=True)
    }
    return [{name: values[i] for name, values in columns.items()} for i in range(table.num_rows)]


def _python_values(arr: pa.Array) -> list[Any]:
    t = arr.type
    if pa.types.is_struct(t):
        names = unique_names([f.name for f in t])
        children = [_python_values(arr.field(i)) for i in range(t.num_fields)]
        return [
            dict(zip(names, (c[j] for c in children), strict=True)) if arr[j].is_valid else None
            for j in range(len(arr))
        ]
    if pa.types.is_list(t):
        flat = _python_values(arr.flatten())
        offsets = arr.offsets.to_pylist()
        return [flat[offsets[j] : offsets[j + 1]] if arr[j].is_valid else None for j in range(len(arr))]
    if pa.types.is_map(t):
        keys, items = _python_values(arr.keys), _python_values(arr.items)
        offsets = arr.offsets.to_pylist()
        return [
            list(zip(keys[offsets[j] : offsets[j + 1]], items[offsets[j] : offsets[j + 1]], strict=True))
            if arr[j].is_valid
            else None
            for j in range(len(arr))
        ]
    return arr.to_pylist()


__all__ = ["json_value", "key_matches", "python_rows"]
