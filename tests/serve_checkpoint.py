"""A checkpoint laid out as Spark writes one (metadata, offsets/ with the query's confs, commits/)
with state stores committed through the product's rocksdb backend, each key in the partition Spark's
hash partitioning sends it to, for the queryable-state service's tests without Spark. The referee
is the input: each batch's puts and deletes, applied to a dict here."""

from __future__ import annotations

import json
import random
import uuid
from pathlib import Path
from typing import Any

from backend_support import changes, commit, make_backend, materialize_if_due
from pystatestore.reading.spark_hash import partition_of
from pystatestore.reading.unsafe_row import encode_row, parse_schema

PARTITIONS = 3
BATCHES = 3
KEY_SCHEMA = json.dumps(
    {
        "type": "struct",
        "fields": [
            {"name": "user", "type": "string", "nullable": True, "metadata": {}},
            {"name": "n", "type": "integer", "nullable": True, "metadata": {}},
        ],
    }
)
VALUE_SCHEMA = json.dumps(
    {
        "type": "struct",
        "fields": [
            {"name": "count", "type": "long", "nullable": False, "metadata": {}},
            {"name": "sum", "type": "long", "nullable": True, "metadata": {}},
        ],
    }
)
CONF = {"spark.sql.shuffle.partitions": str(PARTITIONS)}
State = dict[tuple[str, int], tuple[int, int]]


def write_checkpoint(root: Path) -> tuple[Path, dict[int, State]]:
    """BATCHES batches of puts and deletes over (user, n) keys; returns the checkpoint and the state
    after each batch as the input implies it."""
    ckpt = root / "ckpt"
    for log in ("offsets", "commits"):
        (ckpt / log).mkdir(parents=True)
    (ckpt / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}) + "\n")
    key_type, value_type = parse_schema(KEY_SCHEMA), parse_schema(VALUE_SCHEMA)
    backends = [
        make_backend(
            "rocksdb",
            ckpt / "state" / "0" / str(p),
            root / "work" / str(p),
            min_deltas=2,
            partition_id=p,
            schemas=(KEY_SCHEMA, VALUE_SCHEMA),
        )
        for p in range(PARTITIONS)
    ]
    rnd = random.Random(3)
    state: State = {}
    states = {}
    for batch in range(BATCHES):
        puts = {
            (f"u{rnd.randrange(8)}", rnd.randrange(10)): (rnd.randrange(1, 50), rnd.randrange(1000)) for _ in range(30)
        }
        deletes = [k for k in rnd.sample(sorted(state), min(8, len(state))) if k not in puts]
        state = states[batch] = {k: v for k, v in (state | puts).items() if k not in deletes}
        offsets = {"batchWatermarkMs": 0, "batchTimestampMs": 1_700_000_000_000 + batch, "conf": CONF}
        (ckpt / "offsets" / str(batch)).write_text(f'v1\n{json.dumps(offsets)}\n{{"logOffset":{batch}}}\n')
        for p, backend in enumerate(backends):

            def mine(key: tuple[str, int], p: int = p) -> bool:
                return partition_of(key_type, key, PARTITIONS) == p

            table = changes(
                {encode_row(key_type, k): encode_row(value_type, v) for k, v in puts.items() if mine(k)},
                [encode_row(key_type, k) for k in deletes if mine(k)],
            )
            commit(backend, batch, table, f"batch{batch}", num_keys=sum(1 for k in state if mine(k)))
            materialize_if_due(backend)
        (ckpt / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    for backend in backends:
        backend.close()
    assert states[1] != states[2] and len(states[2]) > 40
    return ckpt, states


def as_rows(state: State, key: dict[str, Any] | None = None) -> dict[tuple[str, int], dict[str, int]]:
    """The rows a scan for `key` (some key columns) must return, from the input."""
    key = key or {}
    return {
        k: {"count": c, "sum": s}
        for k, (c, s) in state.items()
        if all({"user": k[0], "n": k[1]}[name] == want for name, want in key.items())
    }
