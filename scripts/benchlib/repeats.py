"""Repeats: the order providers run in across them (so that no provider always goes first or last),
and each figure's median over them with its range."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")


def rotated(names: list[T], offset: int) -> list[T]:
    offset %= len(names)
    return names[offset:] + names[:offset]


def rotation(names: list[T], repeat: int) -> list[T]:
    """Repeat i's order: starts i names later."""
    return rotated(names, repeat)


def spread_rotation(names: list[T], repeat: int, repeats: int) -> list[T]:
    """Repeat i's order, the starts spread over the list (5 names, 3 repeats: 0, 1, 3), so each
    name goes early and late even when there are fewer repeats than names."""
    return rotated(names, repeat * len(names) // repeats)


def medians_over(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each numeric figure's median over the runs, and (key + '_range') its min and max; 'repeats'."""
    out: dict[str, Any] = {"repeats": len(runs)}
    for key, value in runs[0].items():
        if isinstance(value, (int, float)):
            values = [r[key] for r in runs]
            out[key] = statistics.median(values)
            out[key + "_range"] = (min(values), max(values))
    return out


def range_text(r: dict[str, Any], key: str, fmt: str) -> str:
    """'min-max' of a figure of `medians_over`, or '-' for one run."""
    low, high = r[key + "_range"]
    return f"{format(low, fmt)}-{format(high, fmt)}" if r["repeats"] > 1 else "-"


def of_known(stat: Callable[[list[float]], float], values: Iterable[float]) -> float:
    """`stat` (statistics.mean, median) of the values that are known (not NaN); NaN when none is."""
    known = [v for v in values if not math.isnan(v)]
    return stat(known) if known else math.nan
