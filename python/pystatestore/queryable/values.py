"""Decoded state rows as JSON values, as `pystatestore read -o -` prints them: structs as objects
whose repeated field names are numbered (`sum`, `sum#2`), maps as [key, value] pairs, dates and
times as ISO text, intervals in seconds, bytes in hex, decimals as text."""

from __future__ import annotations

from typing import Any

from ..reading.decoded import json_value
from ..reading.unsafe_row import SparkType, unique_names


def row_json(t: SparkType, values: tuple[Any, ...]) -> dict[str, Any]:
    """A decoded row (`decode_row` of struct type `t`) as a JSON object."""
    names = unique_names([name for name, _, _ in t.fields])
    return {name: _json(ft, v) for name, (_, ft, _), v in zip(names, t.fields, values, strict=True)}


def _json(t: SparkType, v: Any) -> Any:
    if v is None:
        return None
    if t.name == "struct":
        return row_json(t, v)
    if t.name == "array":
        assert t.element is not None
        return [_json(t.element, e) for e in v]
    if t.name == "map":
        assert t.element is not None and t.value is not None
        return [[_json(t.element, k), _json(t.value, x)] for k, x in v]
    if isinstance(v, (bool, int, float, str)):
        return v
    return json_value(v)  # dates, times, intervals, bytes, decimals


__all__ = ["row_json"]
