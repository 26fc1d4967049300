"""A new-host restore with nothing else running: each store of a checkpoint's state directory
restored in turn to its newest version, through the installed pystatestore's read-only reader
(local recovery off, so every byte comes from the checkpoint), in this process and no Spark. What
it prints (JSON: the restore metrics summed over the stores) is comparable with the floor of
reading the same bytes once, which runs alone too; the restore inside a restart batch shares the
cores with the new JVM's start and the other partitions' restores.

    python -m benchlib.restore_alone STATE_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pystatestore.reading.checkpoint import StoreLocation
from pystatestore.reading.store_reader import StoreReader

SUMMED = ("restoreMs", "restoreDownloadMs", "restoreIngestMs", "restoreReplayMs", "restoreOpenMs")


def restore_each_store(state_dir: Path) -> dict[str, int]:
    totals = dict.fromkeys(SUMMED, 0) | {"stores": 0, "restoreChangelogVersions": 0}
    for manifests in sorted(state_dir.glob("*/*/manifests")):
        store = manifests.parent
        location = StoreLocation(int(store.parent.name), int(store.name), "default", f"file:{store}")
        with StoreReader(location) as reader:
            metrics = reader.backend.load(reader.versions[-1]).metrics
        for key in (*SUMMED, "restoreChangelogVersions"):
            totals[key] += int(metrics.get(key, 0))
        totals["stores"] += 1
    return totals


if __name__ == "__main__":
    print(json.dumps(restore_each_store(Path(sys.argv[1]))))
