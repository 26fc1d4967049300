"""Input files of the benchmarks' streaming queries: the file source takes them in the order of
their modification times, so each is stamped with its place in that order."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

ORIGIN = 1_700_000_000  # the modification time of input 0


def stamp_order(path: Path, order: int, origin: int = ORIGIN) -> None:
    """Gives `path` the modification time of place `order`."""
    os.utime(path, (origin + order, origin + order))


def random_updates(keys: int, touched: int, batches: int, seed: int = 42) -> Iterator[tuple[list[int], list[int]]]:
    """(keys, values) of each batch: every key in batch 0, then `touched` random keys per batch,
    each with a random value below 1000; the same for a seed."""
    rnd = random.Random(seed)
    for b in range(batches):
        ks = list(range(keys)) if b == 0 else rnd.sample(range(keys), touched)
        yield ks, [rnd.randrange(1000) for _ in ks]


def write_update_files(input_dir: Path, keys: int, touched: int, files: int, seed: int = 42) -> None:
    """`files` parquet files of (key, value), one per batch: every key in the first, then `touched`
    random keys each (`random_updates`), stamped in order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    input_dir.mkdir(parents=True)
    for b, (ks, values) in enumerate(random_updates(keys, touched, files, seed)):
        path = input_dir / f"batch-{b:05d}.parquet"
        pq.write_table(pa.table({"key": pa.array(ks, pa.int64()), "value": pa.array(values)}), path)
        stamp_order(path, b)
