"""What a restore pays per byte: replaying changelog versions against restoring a snapshot, on one
store, without Spark (the backend as a worker opens it; the checkpoint on the local disk).

For each size, version 1 holds N keys (16-byte keys, 24-byte values), committed as a changelog
version; a fresh instance with nothing local (a new host) loads it once by replaying its changes,
then maintenance makes its snapshot and another fresh instance loads it from the snapshot. Each
load runs --repeat times (fresh instance each), the median reported. The ratio of the two costs per
stored byte is what decision 0041's fraction comes from: replaying f x S bytes of changes costs as
much as restoring f x R x S bytes of snapshot.

    .venv/bin/python scripts/replay_vs_snapshot.py [--keys 250000,1000000,2000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "tests"))

import pyarrow as pa  # noqa: E402

from backend_support import make_backend  # noqa: E402
from benchlib.report import code_version  # noqa: E402
from pystatestore.store import frames  # noqa: E402


def table_of(n: int) -> pa.Table:
    keys = [b"key-%012d" % i for i in range(n)]
    values = [b"value-%018d" % (i * 7) for i in range(n)]
    return pa.table(
        {
            "op": pa.array([frames.OP_PUT] * n, pa.int8()),
            "key": pa.array(keys, pa.binary()),
            "value": pa.array(values, pa.binary()),
        },
        schema=frames.CHANGES_SCHEMA,
    )


def fresh_load(store: Path, work: Path, tag: str) -> dict[str, int]:
    """Version 1 loaded by an instance with nothing on this host; its restore metrics and wall ms."""
    local = work / f"local-{tag}"
    b = make_backend("rocksdb", store, local, options={"localRecovery": "false"}, mode="changelog")
    started = time.perf_counter()
    result = b.load(1, str(local / "views" / "v1"))
    wall = (time.perf_counter() - started) * 1000
    b.close()
    shutil.rmtree(local, ignore_errors=True)
    return {**result.metrics, "wallMs": int(wall)}


def measure(n: int, repeat: int, work: Path) -> dict[str, float]:
    store = work / f"store-{n}"
    writer = make_backend("rocksdb", store, work / f"writer-{n}", options={"localRecovery": "false"}, mode="changelog")
    writer.commit(0, table_of(n), "a1", num_keys=n, view_dir=str(work / f"writer-{n}" / "views" / "c1"))
    replays = [fresh_load(store, work, f"replay-{n}-{i}") for i in range(repeat)]
    job = writer.prepare_materialization(force=True)
    assert job is not None
    writer.finish_materialization(job)
    writer.complete_materialization(job)
    writer.close()
    snaps = [fresh_load(store, work, f"snapshot-{n}-{i}") for i in range(repeat)]
    assert all(r["restoreChangelogVersions"] == 1 for r in replays), replays
    assert all(r["restoreChangelogVersions"] == 0 and r["restoreRemoteFiles"] > 0 for r in snaps), snaps
    changes_bytes = replays[0]["restoreRemoteBytes"] + replays[0]["restoreInlineBytes"]
    snapshot_bytes = snaps[0]["restoreRemoteBytes"] + snaps[0]["restoreInlineBytes"]
    replay_ms = statistics.median(r["wallMs"] for r in replays)
    snapshot_ms = statistics.median(r["wallMs"] for r in snaps)
    shutil.rmtree(store, ignore_errors=True)
    return {
        "keys": n,
        "changes_mib": changes_bytes / 2**20,
        "snapshot_mib": snapshot_bytes / 2**20,
        "replay_ms": replay_ms,
        "snapshot_ms": snapshot_ms,
        "per_byte_ratio": (replay_ms / changes_bytes) / (snapshot_ms / snapshot_bytes),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", default="250000,1000000,2000000")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pss-replay-vs-snapshot-"))
    try:
        rows = [measure(int(n), args.repeat, work) for n in args.keys.split(",")]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"# replay vs snapshot restore, one store, checkpoint on the local disk; code {code_version()}")
    print(f"# machine: {platform.machine()}, {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f} at the end")
    print(f"# command: .venv/bin/python scripts/replay_vs_snapshot.py --keys {args.keys} --repeat {args.repeat}")
    print(
        f"{'keys':>9}{'changes MiB':>13}{'snapshot MiB':>14}{'replay ms':>11}{'snapshot ms':>13}{'per-byte ratio':>16}"
    )
    for r in rows:
        print(
            f"{r['keys']:>9}{r['changes_mib']:>13.1f}{r['snapshot_mib']:>14.1f}{r['replay_ms']:>11.0f}"
            f"{r['snapshot_ms']:>13.0f}{r['per_byte_ratio']:>16.2f}"
        )


if __name__ == "__main__":
    main()
