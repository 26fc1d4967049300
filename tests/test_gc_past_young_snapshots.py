"""A store snapshotted often and retaining few versions (minBatchesToRetain=3, a snapshot every 2
versions, GC at every maintenance, snapshots younger than the grace period): garbage collection
takes the chain before a snapshot once no retained version walks it, and the versions left behind
it still restore from their snapshots. Reading such a store must not ask for what GC took: `verify`
finds nothing missing, and the offline reader finds the schemas in the snapshot."""

from __future__ import annotations

import random
from pathlib import Path

import referee
from backend_support import changes, commit, make_backend, materialize_if_due, state_of
from pystatestore.reading.checkpoint import SparkCheckpoint, StoreLocation
from pystatestore.reading.store_reader import StoreReader
from pystatestore.tools.verification import verify_checkpoint


def test_verify_and_the_reader_accept_a_store_gc_trimmed_behind_young_snapshots(tmp_path: Path) -> None:
    store = tmp_path / "store"
    b = make_backend("rocksdb", store, tmp_path / "w", retain=3, grace=600.0, min_deltas=2)
    rnd = random.Random(3)
    state: dict[bytes, bytes] = {}
    for v in range(1, 13):
        puts = {f"k{rnd.randrange(50)}".encode(): rnd.randbytes(16) for _ in range(20)}
        commit(b, v - 1, changes(puts), f"t{v}", num_keys=len(state | puts))
        state |= puts
        materialize_if_due(b)
        b.maintenance()  # GC, as Spark's maintenance runs it, with every snapshot still young
    manifests = {int(p.stem) for p in (store / "manifests").glob("*.json")}
    assert min(manifests) > 1, f"GC took nothing, so the case is not reached: {sorted(manifests)}"
    verdict = referee.judge_store(store, now=float("inf"), in_flight_seconds=0)
    assert verdict.lost == [], verdict.lost
    location = StoreLocation(0, 1, "default", f"file:{store}")
    report = verify_checkpoint(SparkCheckpoint(f"file:{tmp_path}", None, [], [], stores=[location]))
    assert report.problems == [], [str(p) for p in report.problems]
    with StoreReader(location) as reader:
        for v in sorted(manifests):
            assert reader.schemas(v) == ("k", "v", "raw"), v
    for v in sorted(manifests)[-3:]:
        cold = make_backend("rocksdb", store, tmp_path / f"cold{v}", options={"localRecovery": "false"})
        assert len(state_of(cold, v)) > 0, v
