"""A scan's pages: how many rows one may hold, and the cursor that continues after a page's last
row at the same batch.

Rows come partition by partition (in partition order), and within one in the order of their stored
key bytes, so a position is (partition, last stored key returned) and paging returns every matching
row exactly once. The cursor is opaque to its user: base64url of JSON holding the batch, the
position, a digest of the question (key, operator, store, family) and a checksum of all that, so a
garbled or edited cursor is refused instead of answering something else. It grants nothing a scan
could not read anyway."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass
from typing import Any

DEFAULT_SCAN_LIMIT = 100  # rows a scan's page holds unless it asks for another number
MAX_SCAN_LIMIT = 10_000  # the most rows a page may hold: a bigger scan pages on with its cursor
CURSOR_VERSION = 1
_FIELDS = {"v", "batch", "question", "partition", "after", "check"}


class PageError(ValueError):
    """A scan's limit or cursor that cannot be answered as given (the client's QuestionError)."""


@dataclass(frozen=True)
class ScanPosition:
    """Where a page ended: its last row's partition and stored key (its family's prefix included)."""

    partition: int
    after: bytes


@dataclass(frozen=True)
class ScanCursor:
    batch: int
    question: str  # question_digest() of the scan the page answered
    position: ScanPosition


def page_limit(limit: Any, default: int, maximum: int) -> int:
    """The rows a page holds: `limit`, or `default` when it names none; never more than `maximum`."""
    if limit is None:
        return default
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise PageError(f"limit is a whole number, not {limit!r}")
    if limit < 1:
        raise PageError(f"limit must be at least 1, not {limit}")
    if limit > maximum:
        raise PageError(
            f"limit {limit} is above the most rows a page holds here ({maximum}): ask for at most {maximum} "
            "and page on with the cursor each page returns (cursor=...)"
        )
    return limit


def question_digest(key: dict[str, Any], operator: int, store: str, family: str | None) -> str:
    """Names one scan question, so a cursor is not taken to another (whose rows it would skip)."""
    canonical = json.dumps([operator, store, family, key], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def continued(cursor: Any, question: str, batch: int | None) -> tuple[ScanPosition, int]:
    """(where the last page ended, its batch) from `cursor`, which a page of the scan `question`
    returned; `batch`, when given, must be the cursor's."""
    if not isinstance(cursor, str):
        raise PageError(f"a cursor is the text a page returned, not {cursor!r}")
    try:
        found = decode_cursor(cursor)
    except PageError as e:
        raise PageError(
            f"the cursor is not one this service returned ({e}): pass it on as the page gave it, or start the "
            "scan again without cursor"
        ) from None
    if found.question != question:
        raise PageError(
            "the cursor continues a scan of another key, operator, store or family: ask with the same ones as "
            "its first page"
        )
    if batch is not None and batch != found.batch:
        raise PageError(f"the cursor continues a scan of batch {found.batch}, not {batch}: leave out batch")
    return found.position, found.batch


def _checksum(payload: dict[str, Any]) -> str:
    body = json.dumps({k: v for k, v in payload.items() if k != "check"}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def encode_cursor(cursor: ScanCursor) -> str:
    payload: dict[str, Any] = {
        "v": CURSOR_VERSION,
        "batch": cursor.batch,
        "question": cursor.question,
        "partition": cursor.position.partition,
        "after": base64.b64encode(cursor.position.after).decode("ascii"),
    }
    payload["check"] = _checksum(payload)
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode("ascii").rstrip("=")


def decode_cursor(text: str) -> ScanCursor:
    """The cursor `encode_cursor` made; PageError for anything else."""
    try:
        payload = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (binascii.Error, ValueError, RecursionError):
        raise PageError("it does not decode") from None
    if not isinstance(payload, dict) or set(payload) != _FIELDS:
        raise PageError("it does not hold a scan's position")
    if payload["v"] != CURSOR_VERSION or payload["check"] != _checksum(payload):
        raise PageError("its checksum does not match what it holds")
    batch, question, partition, after = payload["batch"], payload["question"], payload["partition"], payload["after"]
    if not (_whole(batch) and _whole(partition) and isinstance(question, str) and isinstance(after, str)):
        raise PageError("it does not hold a scan's position")
    try:
        after_bytes = base64.b64decode(after, validate=True)
    except (binascii.Error, ValueError):
        raise PageError("its position does not decode") from None
    return ScanCursor(batch, question, ScanPosition(partition, after_bytes))


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


__all__ = [
    "DEFAULT_SCAN_LIMIT",
    "MAX_SCAN_LIMIT",
    "PageError",
    "ScanCursor",
    "ScanPosition",
    "continued",
    "decode_cursor",
    "encode_cursor",
    "page_limit",
    "question_digest",
]
