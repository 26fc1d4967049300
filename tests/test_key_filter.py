"""A scan's byte test of a key (`queryable/key_filter.py`) never rejects a key the decoded match
accepts, and does reject keys whose integer or string columns differ. The referee is the decoded
match the scan applied to every key before (decode the row, then compare values)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pystatestore.queryable.key_filter import key_prefilter
from pystatestore.queryable.values import row_json
from pystatestore.reading.decoded import key_matches
from pystatestore.reading.unsafe_row import decode_row, encode_row, parse_schema

# Every kind the filter treats (integers of each width, strings) and some it leaves to the decoder.
SCHEMA = parse_schema(
    json.dumps(
        {
            "type": "struct",
            "fields": [
                {"name": n, "type": t, "nullable": True, "metadata": {}}
                for n, t in (
                    ("id", "long"),
                    ("name", "string"),
                    ("small", "byte"),
                    ("mid", "short"),
                    ("n", "integer"),
                    ("score", "double"),
                    ("flag", "boolean"),
                )
            ],
        }
    )
)
NAMES = [name for name, _, _ in SCHEMA.fields]
LIMITS = {"id": 2**63, "small": 2**7, "mid": 2**15, "n": 2**31}


def column_values(name: str) -> st.SearchStrategy[Any]:
    if name in LIMITS:
        bound = LIMITS[name]
        return st.one_of(st.integers(-bound, bound - 1), st.integers(-3, 3))
    if name == "name":
        return st.one_of(st.text(max_size=12), st.sampled_from(["", "a", "ab", "b"]))
    if name == "score":
        return st.floats(allow_nan=False, allow_infinity=False)
    return st.booleans()


rows = st.tuples(*[st.one_of(st.none(), column_values(n)) for n in NAMES])


@st.composite
def questions(draw: st.DrawFn, row: tuple[Any, ...]) -> dict[str, Any]:
    """A partial key: some columns, each the row's value, another of its kind, or another JSON type
    (out-of-range integers and 1.0 for 1 included)."""
    wanted: dict[str, Any] = {}
    for name, value in zip(NAMES, row, strict=True):
        if not draw(st.booleans()):
            continue
        kind = draw(st.sampled_from(["same", "other", "odd"]))
        if kind == "same":
            wanted[name] = value
        elif kind == "other":
            wanted[name] = draw(column_values(name))
        else:
            wanted[name] = draw(st.sampled_from([None, 1.0, "1", 2**70, -(2**70), True]))
    return wanted


@settings(max_examples=600, deadline=None)
@given(st.data())
def test_the_byte_test_rejects_only_keys_the_decoded_match_rejects(data: st.DataObject) -> None:
    row = data.draw(rows)
    wanted = data.draw(questions(row))
    stored = memoryview(encode_row(SCHEMA, row))
    matches = key_matches(row_json(SCHEMA, decode_row(SCHEMA, stored)), [wanted])
    may_match = key_prefilter(SCHEMA, NAMES, wanted)
    if matches:
        assert may_match is None or may_match(stored), (row, wanted)


def test_keys_that_differ_in_an_integer_or_string_column_are_rejected_on_bytes() -> None:
    row = (7, "seven", 1, 2, 3, 0.5, True)
    stored = memoryview(encode_row(SCHEMA, row))
    for wanted in (
        {"id": 8},
        {"name": "seven!"},
        {"name": "seve"},
        {"name": "seveN"},
        {"small": -1},
        {"n": 3, "mid": 9},
        {"id": 2**64},
    ):
        may_match = key_prefilter(SCHEMA, NAMES, wanted)
        assert may_match is not None and not may_match(stored), wanted
    for wanted in ({"id": 7, "name": "seven"}, {"small": 1, "mid": 2, "n": 3}):
        may_match = key_prefilter(SCHEMA, NAMES, wanted)
        assert may_match is not None and may_match(stored), wanted
    # Nothing the byte test can read: the decoded match alone decides.
    assert key_prefilter(SCHEMA, NAMES, {"score": 0.5, "flag": True}) is None
    assert key_prefilter(SCHEMA, NAMES, {"id": 7.0}) is None
