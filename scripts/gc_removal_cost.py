"""What making manifest removals durable in order costs garbage collection (issue 83, decision
0040): one store of changelog commits (a maintenance snapshot every 10 versions), then one GC run
that removes about a minute's manifests of a 1-second trigger, timed three ways on the disk of
`--dir`: a round at a time (the code: `cleanup.removal_rounds`, a sync after each), one manifest at
a time (a sync after each), and one sync for all of them (the code before issue 83, which a power
cut keeping any part of the unsynced removals can leave with a hole in a chain). Runs alternate
between them, each on a fresh copy of the same store.

    .venv/bin/python scripts/gc_removal_cost.py [--versions 64] [--runs 7] [--dir /var/tmp]
"""

from __future__ import annotations

import argparse
import logging
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "tests")]

from backend_support import changes, make_backend, materialize_if_due  # noqa: E402
from pystatestore.store import frames  # noqa: E402
from pystatestore.store.backends import cleanup  # noqa: E402
from pystatestore.store.manifest import SNAPSHOT_DIR, version_of_manifest  # noqa: E402
from pystatestore.store.remote import RemoteStore  # noqa: E402
from pystatestore.store.retention import RetentionPlan  # noqa: E402

GRACE = 600.0
ROUNDS = cleanup.delete


def delete_with_one_sync(remote: RemoteStore, planned: RetentionPlan, fault_point: Callable[[str], None]) -> int:
    """`cleanup.delete` as it was before issue 83: every manifest removal, then one sync."""
    by_version = sorted(planned.delete_manifests, key=lambda rel: version_of_manifest(rel) or -1, reverse=True)
    manifests = [*by_version, *(r for r in planned.delete_files if r.startswith(SNAPSHOT_DIR + "/"))]
    files = [r for r in planned.delete_files if not r.startswith(SNAPSHOT_DIR + "/")]
    for rel in manifests:
        remote.delete(rel)
        fault_point("gc:deleted")
    if manifests and files:
        remote.sync_removals(manifests)
    for rel in files:
        remote.delete(rel)
        fault_point("gc:deleted")
    return sum(remote.remove_dir_if_empty(d) for d in planned.delete_dirs)


def build_store(store: Path, work: Path, versions: int) -> None:
    rng = random.Random(1)
    backend = make_backend("rocksdb", store, work, retain=2, grace=GRACE, mode="changelog", min_deltas=10)
    state: dict[bytes, bytes] = {}
    try:
        for v in range(versions):
            puts = {f"k{rng.randrange(500):03d}".encode(): rng.randbytes(40) for _ in range(20)}
            table = frames.sorted_by_key(changes(puts))
            frames.apply_changes(state, table)
            backend.commit(v, table, f"a{v}", backend.db.manifest_id if v else None, num_keys=len(state))
            if (v + 1) % 10 == 0:
                materialize_if_due(backend)
    finally:
        backend.close()


def one_at_a_time(remote: RemoteStore, planned: RetentionPlan, fault_point: Callable[[str], None]) -> int:
    """`cleanup.delete` with a round for each manifest, newest first."""
    return ROUNDS(remote, replace(planned, manifest_rounds=()), fault_point)


def timed_gc(store: Path, work: Path, delete: Callable[..., int]) -> tuple[float, float, int, int]:
    """(the GC run's ms, its removals' ms, manifests removed, rounds) with `delete` in cleanup's place."""
    spent: list[float] = []
    rounds: list[int] = []

    def timed(remote: RemoteStore, planned: RetentionPlan, fault_point: Callable[[str], None]) -> int:
        rounds.append(len(planned.manifest_rounds) if delete is ROUNDS else len(planned.delete_manifests))
        t = time.perf_counter()
        try:
            return delete(remote, planned, fault_point)
        finally:
            spent.append((time.perf_counter() - t) * 1000)

    saved, cleanup.delete = cleanup.delete, timed
    backend = make_backend("rocksdb", store, work, retain=2, grace=GRACE, mode="changelog", min_deltas=10)
    try:
        t = time.perf_counter()
        report = backend.maintenance(time.time() + GRACE + 1)
        total = (time.perf_counter() - t) * 1000
    finally:
        backend.close()
        cleanup.delete = saved
    return total, spent[0], int(report["deletedManifests"]), rounds[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--versions", type=int, default=64)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--dir", default=None, help="where the stores are made (default: the system's temp dir)")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    variants = {
        "a round at a time": ROUNDS,
        "one manifest at a time": one_at_a_time,
        "one sync (before)": delete_with_one_sync,
    }
    results: dict[str, list[tuple[float, float, int, int]]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory(prefix="gc-cost-", dir=args.dir) as tmp:
        template = Path(tmp) / "template"
        build_store(template / "store", Path(tmp) / "build-work", args.versions)
        for run in range(args.runs):
            for name in list(variants) if run % 2 == 0 else reversed(list(variants)):
                store = Path(tmp) / f"run-{run}-{len(results[name])}"
                shutil.copytree(template, store)
                results[name].append(timed_gc(store / "store", Path(tmp) / f"work-{run}-{name[:3]}", variants[name]))
                shutil.rmtree(store)
    where = args.dir or tempfile.gettempdir()
    print(f"GC of a changelog store after {args.versions} versions, {args.runs} runs each, on {where}")
    for name, runs in results.items():
        total = statistics.median(r[0] for r in runs)
        removals = statistics.median(r[1] for r in runs)
        syncs = "1 sync" if variants[name] is delete_with_one_sync else f"{runs[0][3]} syncs"
        print(f"  {name}: {runs[0][2]} manifests, {syncs}; GC run p50 {total:.1f} ms, removals p50 {removals:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
