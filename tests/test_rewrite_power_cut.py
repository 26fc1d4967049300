"""A power cut during `pystatestore repartition` never leaves a checkpoint that looks finished but is
not (issue 83, decision 0040).

A pystatestore checkpoint is made by hand (no Spark: the direct route needs no JVM), and its
repartition runs on the recording disk of tests/power_cut.py, which logs every write, name and
fsync under the output. The checks read only that log, through the simulator's images:
- once the real offsets are in place and that rename is fsynced, the image with nothing unsynced is
  the finished checkpoint, file for file;
- just before that rename, the image with nothing unsynced is already the finished checkpoint but
  for the one line that says it is unfinished: every file the last step covers is durable first;
- at every cut, in images keeping any part of what was unsynced: where the real offsets are there,
  so is everything else, and where any file of the output is there (but a temporary one), so is
  the unfinished line (or the real offsets).
"""

from __future__ import annotations

import json
import random
import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from power_cut import Image, RecordingDisk, crash_image, disk_tree
from pystatestore.reading.spark_hash import stored_key_hashes
from pystatestore.reading.unsafe_row import parse_schema
from pystatestore.spark_minors import PROVIDER_CLASS
from pystatestore.store import frames, local_disk
from pystatestore.store.backends import BACKENDS, StoreContext
from pystatestore.store.manifest import KEY_ENCODING_RAW
from pystatestore.store.remote import RemoteStore
from pystatestore.tools.rewrite import rewrite, runs_without_spark
from pystatestore.tools.rewrite_plan import PARTITIONS_CONF, PROVIDER_CONF, UNFINISHED_LINE, plan_rewrite

KEY_SCHEMA = json.dumps({"type": "struct", "fields": [{"name": "k", "type": "long", "nullable": True, "metadata": {}}]})
VALUE_SCHEMA = json.dumps(
    {"type": "struct", "fields": [{"name": "n", "type": "long", "nullable": True, "metadata": {}}]}
)
SOURCE_PARTITIONS = 2


def unsafe_row_of_long(value: int) -> bytes:
    """Spark's UnsafeRow of one non-null long: an 8-byte null bitset, then the value."""
    return struct.pack("<qq", 0, value)


def source_checkpoint(root: Path) -> Path:
    """What a streaming aggregation on pystatestore leaves after batch 0: Spark's logs, the
    operator's metadata, and version 1 of each partition's store, every key where Spark's hash
    puts it."""
    conf = {PROVIDER_CONF: PROVIDER_CLASS, PARTITIONS_CONF: str(SOURCE_PARTITIONS)}
    (root / "offsets").mkdir(parents=True)
    (root / "commits").mkdir()
    (root / "metadata").write_text('{"id":"rewrite-power-cut"}\n')
    (root / "offsets" / "0").write_text(
        "v1\n" + json.dumps({"batchWatermarkMs": 0, "conf": conf}) + '\n{"logOffset":0}\n'
    )
    (root / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    (root / "sources" / "0").mkdir(parents=True)
    (root / "sources" / "0" / "0").write_text('v1\n{"path":"file:///in/part-0","timestamp":0,"batchId":0}\n')
    meta = {
        "operatorInfo": {"operatorId": 0, "operatorName": "stateStoreSave"},
        "stateStoreInfo": [{"storeName": "default", "numColsPrefixKey": 0, "numPartitions": SOURCE_PARTITIONS}],
    }
    (root / "state" / "0" / "_metadata").mkdir(parents=True)
    (root / "state" / "0" / "_metadata" / "metadata").write_text("v1\n" + json.dumps(meta))
    keys = pa.array([unsafe_row_of_long(k) for k in range(40)], pa.binary())
    hashes = stored_key_hashes(parse_schema(KEY_SCHEMA), keys, KEY_ENCODING_RAW, 1).astype(np.int64)
    for p in range(SOURCE_PARTITIONS):
        mine = [key for key, h in zip(keys.to_pylist(), hashes, strict=True) if h % SOURCE_PARTITIONS == p]
        pairs = {key: struct.pack("<q", len(key) * 1000 + i) for i, key in enumerate(mine)}
        store = root / "state" / "0" / str(p)
        ctx = StoreContext(
            store_dir=f"file:{store}",
            operator_id=0,
            partition_id=p,
            store_name="default",
            key_schema=KEY_SCHEMA,
            value_schema=VALUE_SCHEMA,
            min_versions_to_retain=100,
            orphan_grace_seconds=600.0,
            options={"localRecovery": "false", "commitMode": "snapshot"},
            local_dir=str(root.parent / f"work-{p}"),
            key_encoding=KEY_ENCODING_RAW,
            views_dir=str(root.parent / f"work-{p}"),
            host_dir=str(root.parent / f"work-{p}"),
        )
        backend = BACKENDS["rocksdb"](ctx, RemoteStore(ctx.store_dir))
        try:
            table = frames.sorted_by_key(
                pa.table(
                    {
                        "op": pa.array([frames.OP_PUT] * len(pairs), pa.int8()),
                        "key": pa.array(list(pairs), pa.binary()),
                        "value": pa.array(list(pairs.values()), pa.binary()),
                    },
                    schema=frames.CHANGES_SCHEMA,
                )
            )
            backend.commit(0, table, "batch-0", None, num_keys=len(pairs))
        finally:
            backend.close()
    return root


def under(image: Image, prefix: str) -> dict[str, bytes | None]:
    return {p[len(prefix) + 1 :]: c for p, c in image.tree.items() if p.startswith(prefix + "/")}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[list, dict[str, bytes | None], str]:
    """The repartition 2 -> 3 recorded: its log, the finished output (relative paths) and the
    output's offsets/<B+1> name."""
    tmp = tmp_path_factory.mktemp("rewrite-power-cut")
    source = source_checkpoint(tmp / "source")
    disk_root = tmp / "disk"
    disk_root.mkdir()
    plan = plan_rewrite("repartition", str(source), str(disk_root / "out"), partitions=3)
    assert runs_without_spark(plan)
    disk = RecordingDisk(disk_root)
    saved, local_disk.DISK = local_disk.DISK, disk
    try:
        rewrite(plan, None, lambda what, done, total: None)
    finally:
        local_disk.DISK = saved
    finished = disk_tree(disk_root / "out")
    assert not any(p.startswith(".pystatestore-rewrite") for p in finished)
    return disk.events, finished, f"offsets/{plan.write_batch}"


def test_the_last_step_comes_after_everything_it_covers_is_durable(recorded: tuple) -> None:
    events, finished, last = recorded
    unfinished = finished | {last: UNFINISHED_LINE.format(command="repartition").encode() + b"\n"}
    assert finished[last] != unfinished[last]
    # The completing rename: the real offsets over the unfinished line.
    done = max(i for i, e in enumerate(events) if e.op == "rename" and e.other == f"out/{last}")
    before = under(crash_image(events, done, "lost"), "out")
    assert before == unfinished, "a file or name the finished checkpoint needs was not durable before its last step"
    synced = next(i for i, e in enumerate(events) if i > done and e.op == "dirsync" and e.path == "out/offsets")
    assert under(crash_image(events, synced + 1, "lost"), "out") == finished


def test_no_cut_leaves_a_checkpoint_that_looks_finished_but_is_not(recorded: tuple) -> None:
    events, finished, last = recorded
    unfinished_line = UNFINISHED_LINE.format(command="repartition").encode() + b"\n"
    complete = 0
    for cut in range(len(events) + 1):
        for kind, draws in (("lost", 1), ("mixed", 2), ("subset", 3)):
            for draw in range(draws):
                image = under(crash_image(events, cut, kind, random.Random(f"{cut}-{kind}-{draw}")), "out")
                offsets = image.get(last)
                if offsets == finished[last]:
                    complete += 1
                    assert image == finished, f"cut {cut} ({kind} {draw}): the offsets say done, the rest is not"
                elif any(c is not None and not p.endswith(".tmp") for p, c in image.items()):
                    assert offsets == unfinished_line, f"cut {cut} ({kind} {draw}): files, and nothing says unfinished"
    assert complete > 0
