"""A micro-batch's figures from its progress report, as Spark gives it (StreamingQueryProgress,
as JSON)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any


def batch_ms(progress: dict[str, Any]) -> int:
    """A batch's time, as Spark measures it (triggerExecution)."""
    return progress["durationMs"]["triggerExecution"]


def started_at(progress: dict[str, Any]) -> float:
    """When a batch started (epoch seconds)."""
    return dt.datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp()


def custom_metric(progress: dict[str, Any], key: str, default: float = -1) -> float:
    """One of the first state operator's custom metrics (ours are named pystatestore...)."""
    return progress["stateOperators"][0].get("customMetrics", {}).get(key, default)


def progress_json(progress: list[Any]) -> list[dict[str, Any]]:
    """PySpark's progress objects as plain dicts."""
    return [json.loads(p.json) for p in progress]
