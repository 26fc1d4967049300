"""What the queryable-state client answers, and the errors a question can get."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..store.errors import CheckpointMissingError, StateStoreError


class QuestionError(StateStoreError):
    """A question the checkpoint cannot answer as asked: an unknown operator, store, state variable
    or key column, or a value of the wrong type (HTTP 400)."""

    advice = "GET /v1/operators (StateClient.operators()) lists the operators, stores, variables and key columns."


class BatchGoneError(CheckpointMissingError):
    """A batch that is not, or no longer, in the commit log or the retained versions (HTTP 404)."""

    advice = "Ask for a batch the query still retains (spark.sql.streaming.minBatchesToRetain), or leave out batch."


@dataclass(frozen=True)
class Answer:
    """One key's value at `batch` (None when absent): a JSON object, or a list of them for a state
    variable holding several values per key."""

    batch: int
    found: bool
    value: Any
    partition: int | None  # None: a key scanned for (not its store's partitioning key) and not found

    def to_json(self) -> dict[str, Any]:
        return {"batch": self.batch, "found": self.found, "value": self.value, "partition": self.partition}


@dataclass(frozen=True)
class Lookup:
    """Several keys, every one read at the same `batch`."""

    batch: int
    results: list[Answer]

    def to_json(self) -> dict[str, Any]:
        return {
            "batch": self.batch,
            "results": [{"found": a.found, "value": a.value, "partition": a.partition} for a in self.results],
        }


@dataclass(frozen=True)
class Scan:
    """One page of rows whose key has the given fields, at `batch`; `complete` is False when more
    rows remain, and then `cursor` continues after this page's last row, at the same batch."""

    batch: int
    rows: list[dict[str, Any]]
    complete: bool
    cursor: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"batch": self.batch, "rows": self.rows, "complete": self.complete, "cursor": self.cursor}


__all__ = ["Answer", "BatchGoneError", "Lookup", "QuestionError", "Scan"]
