"""How many snapshots a long query leaves per store, and how many Spark forced.

Spark 4.2+'s state store coordinator judges a store "lagging" when the snapshot versions it was
told about trail the query by 5 x minDeltasForSnapshot versions and 10 x the maintenance interval;
with spark.sql.streaming.stateStore.forceSnapshotUploadOnLag (default true) it then passes
forceSnapshotOnCommit=true to every getStore of that store. A provider that never reports its
snapshots is lagging from about ten minutes into every query at Spark's defaults, and every commit
becomes a snapshot. This runs a streaming aggregation long enough to show it, with everything
retained, and counts what the checkpoint holds (read from the files, not from our metrics):

    .venv/bin/python scripts/snapshot_cadence.py [--batches 120] [--partitions 4] [--min-deltas 10]
        [--maintenance 1s] [--commit-mode changelog|snapshot] [--pyspark 4.1|4.2|4.3]

Prints per store: versions, snapshots and forced snapshots (from the progress metrics), then one
line with the maximum, against versions / minDeltasForSnapshot (what is due).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

from benchlib.build import reexec_under_pyspark
from benchlib.inputs import stamp_order


def snapshots_per_store(state_dir: Path, commit_mode: str) -> dict[str, tuple[int, int]]:
    """store dir -> (versions, snapshots), read from the checkpoint's own files: a changelog-mode
    snapshot is a file under snapshots/; a snapshot-mode commit's manifest is a snapshot itself."""
    out: dict[str, tuple[int, int]] = {}
    for manifests in sorted(state_dir.glob("*/*/manifests")):
        store = manifests.parent
        versions = [p for p in manifests.iterdir() if re.fullmatch(r"\d+\.json", p.name)]
        if commit_mode == "snapshot":
            snaps = sum(1 for p in versions if json.loads(p.read_text()).get("kind") == "snapshot")
        else:
            snap_dir = store / "snapshots"
            snaps = len(list(snap_dir.glob("*.json"))) if snap_dir.is_dir() else 0
        out[str(store.relative_to(state_dir))] = (len(versions), snaps)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=120)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--min-deltas", type=int, default=10)
    ap.add_argument("--maintenance", default="1s")
    ap.add_argument("--commit-mode", choices=["changelog", "snapshot"], default="changelog")
    ap.add_argument("--pyspark", help="the Spark minor to run (default: the venv's)")
    ap.add_argument("--workdir", help="keep the checkpoint here (default: a temporary directory)")
    args = ap.parse_args()
    reexec_under_pyspark(args.pyspark)

    import pyspark
    from pyspark.sql import functions as F

    from benchlib.session import start_noop, start_session

    work = Path(args.workdir or tempfile.mkdtemp(prefix="pss-cadence-"))
    input_dir, checkpoint = work / "in", work / "ckpt"
    input_dir.mkdir(parents=True, exist_ok=True)
    for b in range(args.batches):
        (input_dir / f"b{b:05d}.json").write_text(
            "".join(json.dumps({"key": f"k{(b * 7 + i) % 200}", "value": i}) + "\n" for i in range(50))
        )
    spark = start_session(
        "pystatestore-snapshot-cadence",
        partitions=args.partitions,
        **{
            "spark.sql.streaming.stateStore.maintenanceInterval": args.maintenance,
            "spark.sql.streaming.stateStore.minDeltasForSnapshot": str(args.min_deltas),
            "spark.sql.streaming.minBatchesToRetain": str(args.batches * 10),
            "spark.sql.streaming.stateStore.pystatestore.commitMode": args.commit_mode,
        },
    )
    files = sorted(input_dir.iterdir())
    for i, f in enumerate(files):
        stamp_order(f, i)
    counts = (
        spark.readStream.schema("key string, value long")
        .option("maxFilesPerTrigger", 1)
        .json(str(input_dir))
        .groupBy("key")
        .agg(F.sum("value").alias("total"))
    )
    query = start_noop(counts, checkpoint)
    query.awaitTermination()
    forced = made = 0
    for p in query.recentProgress:
        for op in p["stateOperators"]:
            m = op.get("customMetrics", {})
            forced += m.get("pystatestoreSnapshotsForced", 0)
            made += m.get("pystatestoreSnapshotsMade", 0)
    spark.stop()
    per_store = snapshots_per_store(checkpoint / "state", args.commit_mode)
    for store, (versions, snaps) in sorted(per_store.items()):
        print(f"  store {store}: {versions} versions, {snaps} snapshots")
    versions = max(v for v, _ in per_store.values())
    most = max(s for _, s in per_store.values())
    print(
        f"pyspark {pyspark.__version__}, {args.commit_mode} commits, {args.batches} batches, {args.partitions} "
        f"partitions, minDeltasForSnapshot={args.min_deltas}, maintenanceInterval={args.maintenance}: at most "
        f"{most} snapshots per store ({versions // args.min_deltas} due); progress metrics: {made} snapshots made, "
        f"{forced} forced (of the last {len(query.recentProgress)} batches reported)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
