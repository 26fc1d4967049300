"""How much one question may ask of the service (a scan's page size is paging.py's): the keys of one
lookup, the bytes of its HTTP body, and the characters of a key given in a query string. Each bound
keeps one request from holding the service's memory or its event loop; a bigger question is split
into several (the messages say so)."""

from __future__ import annotations

MAX_LOOKUP_KEYS = 1_000  # keys one lookup (StateClient.get_many, POST /v1/lookup) may ask at once
KEY_TEXT_MAX = 4_096  # characters of a key's JSON in a query string (key=...), and a lookup body's room per key
BODY_ROOM = 64 * 1024  # a lookup body's room beyond its keys: the other fields, whitespace


class LimitError(ValueError):
    """A question above one of the bounds (the client's QuestionError)."""


def check_lookup_keys(count: int, maximum: int) -> None:
    if count > maximum:
        raise LimitError(
            f"{count:,} keys in one lookup, above the most one lookup may ask here ({maximum:,}): split the keys "
            f"over several lookups of at most {maximum:,}"
        )


def lookup_body_max(keys_max: int) -> int:
    """The bytes a POST /v1/lookup body may hold: KEY_TEXT_MAX for each key it may ask, plus BODY_ROOM."""
    return keys_max * KEY_TEXT_MAX + BODY_ROOM


def body_too_large(size: int | None, maximum: int, keys_max: int) -> str:
    """The 413's message: `size` the body's declared bytes, None when it went past `maximum` while read."""
    found = f"{size:,} bytes" if size is not None else f"more than {maximum:,} bytes"
    return (
        f"the body is {found}, above the most a lookup's body may hold here ({maximum:,} bytes: "
        f"{KEY_TEXT_MAX:,} for each of the {keys_max:,} keys a lookup may ask, plus {BODY_ROOM:,}): split the keys "
        "over several lookups"
    )


def key_text_too_long(name: str, length: int, advice: str) -> str | None:
    """Why a query string's `name`=JSON of `length` characters is refused (414), or None if it is not."""
    if length <= KEY_TEXT_MAX:
        return None
    return (
        f"{name}= is {length:,} characters, above the most a key in a query string may hold here "
        f"({KEY_TEXT_MAX:,}): {advice}"
    )


__all__ = [
    "BODY_ROOM",
    "KEY_TEXT_MAX",
    "MAX_LOOKUP_KEYS",
    "LimitError",
    "body_too_large",
    "check_lookup_keys",
    "key_text_too_long",
    "lookup_body_max",
]
