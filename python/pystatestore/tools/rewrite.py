"""`pystatestore migrate` and `repartition`: a checkpoint's state rewritten as one new batch.

Spark keeps a query's provider class and shuffle partition count in its offset log for the life of
the checkpoint, so neither can change by conf. A rewrite reads the state of the last committed
batch B (Spark's state data source, so any provider's files are read by that provider's code),
places every key in the partition Spark's `HashPartitioning` gives it for the target partition
count, and writes it as the target provider's own code writes it (Spark's providers through
their `StateStoreProvider`, the shim's `StateRewrite`: rewrite_spark.py; ours by the backend's
commit: rewrite_direct.py) as the state after a new batch B+1 that reads no input: the same
offsets as B, the conf naming the target provider and partition count. The query restarted on the
result goes on with batch B+2, exactly once. This is what Spark 4.2+'s own offline repartitioning
does for its RocksDB provider; see docs/decisions/0026-state-rewrite.md.

Nothing is lost and nothing is half-done: the source checkpoint is only read; the new one starts
with `offsets/<B+1>` holding one line that Spark refuses as a malformed log and names (so a query
started on an unfinished rewrite fails, naming it), every store written is read back (Spark's
providers through their own code, ours from its files) and compared with what was meant to be
written, and the last step replaces that line by the real offsets. A power cut does not undo
that: every write goes through `local_disk.DISK` (decision 0040), the unfinished line is durable
before anything else is written, and the real offsets are written only once every file of the
new checkpoint and every directory naming one is fsynced.

This module is the command's course: `plan_rewrite` (rewrite_plan.py) says what will be done,
`rewrite` starts the new checkpoint, picks the route (`runs_without_spark`) and finishes: the new
batch's commit, verification of our stores, and the real offsets last.
"""

from __future__ import annotations

import json
import os
import uuid
from functools import partial
from pathlib import Path
from typing import Any

from ..spark_minors import PROVIDER_CLASS
from ..store import local_disk
from .rewrite_direct import rewrite_our_stores, stored_key_encoding
from .rewrite_plan import (
    DATA_POINT,
    NAME_POINT,
    SCRATCH_DIR,
    UNFINISHED_LINE,
    Progress,
    RewriteError,
    RewritePlan,
    StoreResult,
    log_batches,
    operator_metadata,
    read_offsets_entry,
)
from .rewrite_spark import exported_source, rewrite_in_spark


def rewrite(plan: RewritePlan, spark: Any, progress: Progress) -> list[StoreResult]:
    """Runs `plan`: in `spark` (a local session with the shim jar and adaptive execution off), or
    without it where both ends are pystatestore (`spark` may then be None)."""
    direct = runs_without_spark(plan)
    if not direct and (spark is None or spark.conf.get("spark.sql.adaptive.enabled") != "false"):
        raise RewriteError(
            "the rewrite needs a Spark session with spark.sql.adaptive.enabled=false", store=str(plan.output)
        )
    source_commits = log_batches(plan.source / "commits")[-1:]
    _start_output(plan)
    if direct:
        results = rewrite_our_stores(plan, progress)
    elif plan.target_provider == PROVIDER_CLASS:
        results = rewrite_our_stores(plan, progress, partial(exported_source, plan, spark, progress))
    else:
        results = rewrite_in_spark(plan, spark, progress)
    if (
        log_batches(plan.source / "commits")[-1:] != source_commits
        or log_batches(plan.source / "offsets")[-1] > plan.read_batch
    ):
        raise RewriteError(
            "the source checkpoint's logs moved while it was rewritten: a query is running on it",
            store=str(plan.source),
            advice="Stop the query, delete the output, and run the command again.",
        )
    local_disk.DISK.remove_tree(str(plan.output / SCRATCH_DIR))  # durable with the output's names, below
    _write_commit(plan)
    if plan.target_provider == PROVIDER_CLASS:
        _verify_our_stores(plan)
    sync_names(plan.output)
    _publish_offsets(plan)
    return results


def runs_without_spark(plan: RewritePlan) -> bool:
    """Whether both ends are pystatestore with the key encoding unchanged: then nothing needs Spark."""
    return plan.source_provider == plan.target_provider == PROVIDER_CLASS and all(
        plan.key_encodings.get(kind) == stored_key_encoding(kind, plan.new_conf) for kind in plan.stores
    )


# -- the new checkpoint's files -------------------------------------------------------------------
# Every write below goes through local_disk.DISK, its data fsynced; the directories naming the files
# are fsynced together before the last step (`sync_names`), and the last step is fsynced itself.


def make_dirs(plan: RewritePlan, path: Path) -> None:
    """`path` and the directories down to it from the output made, each durable in its parent
    (the output's own name included)."""
    local_disk.DISK.make_dirs(str(path), NAME_POINT, root=str(plan.output))


def _copy(plan: RewritePlan, src: Path, dst: Path) -> None:
    make_dirs(plan, dst.parent)
    local_disk.DISK.copy_file(str(src), str(dst), DATA_POINT)
    os.utime(dst, ns=(src.stat().st_atime_ns, src.stat().st_mtime_ns))  # as shutil.copy2 kept them


def _copy_tree(plan: RewritePlan, src: Path, dst: Path) -> None:
    """Every file and directory below `src` copied to `dst` (which must not exist), data fsynced."""
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames.sort()
        target = dst / Path(dirpath).relative_to(src)
        make_dirs(plan, target)
        for name in sorted(filenames):
            _copy(plan, Path(dirpath) / name, target / name)


def _copy_log(plan: RewritePlan, src_dir: Path, dst_dir: Path, batches: list[int]) -> None:
    """Log entries 0..B with Hadoop's checksum files, so the copy reads as the source does."""
    for b in batches:
        _copy(plan, src_dir / str(b), dst_dir / str(b))
        crc = src_dir / f".{b}.crc"
        if crc.is_file():
            _copy(plan, crc, dst_dir / crc.name)


def _write_file(plan: RewritePlan, path: Path, text: str) -> None:
    """Written whole to a temporary name, fsynced, then renamed and the rename fsynced: a reader
    sees the old file or the new one, and after a power cut too."""
    make_dirs(plan, path.parent)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    local_disk.DISK.write(str(tmp), text.encode(), DATA_POINT)
    local_disk.DISK.replace(str(tmp), str(path), NAME_POINT)


def sync_names(output: Path) -> None:
    """Fsyncs every directory of the output, deepest first: each file written in it (by this
    command, a store's backend or a JVM) and each removal (the scratch directory) is then named on
    disk. Data was fsynced as each file was written."""
    dirs = [Path(dirpath) for dirpath, _, _ in os.walk(output)]
    for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
        local_disk.DISK.sync_dir(str(d), NAME_POINT)


def _start_output(plan: RewritePlan) -> None:
    out, src, b = plan.output, plan.source, plan.read_batch
    if out.exists():
        raise RewriteError(
            "the output exists: a rewrite writes a new checkpoint and never touches an existing directory",
            store=str(out),
            advice="Name a directory that does not exist yet.",
        )
    # First of all, and durably: a query started on this directory now fails, naming what it is.
    _write_file(plan, out / "offsets" / str(plan.write_batch), UNFINISHED_LINE.format(command=plan.command) + "\n")
    _copy(plan, src / "metadata", out / "metadata")
    _copy_log(plan, src / "offsets", out / "offsets", [x for x in log_batches(src / "offsets") if x <= b])
    _copy_log(plan, src / "commits", out / "commits", [x for x in log_batches(src / "commits") if x <= b])
    if (src / "sources").is_dir():
        _copy_tree(plan, src / "sources", out / "sources")
    for op in sorted({s.operator_id for s in plan.stores}):
        src_op, out_op = src / "state" / str(op), out / "state" / str(op)
        # Operator metadata and schema files; Spark reads store schemas from partition 0 only.
        for sub in ("_metadata", "_stateSchema"):
            if (src_op / sub).is_dir():
                _copy_tree(plan, src_op / sub, out_op / sub)
        for meta_dir in sorted((src_op / "0").rglob("_metadata")) if (src_op / "0").is_dir() else []:
            if meta_dir.is_dir():
                _copy_tree(plan, meta_dir, out_op / "0" / meta_dir.relative_to(src_op / "0"))
        meta = operator_metadata(src, op)
        for info in meta.get("stateStoreInfo", []):
            info["numPartitions"] = plan.target_partitions
        crc = out_op / "_metadata" / ".metadata.crc"
        if crc.exists():
            local_disk.DISK.unlink(str(crc))  # the content changes
        _write_file(plan, out_op / "_metadata" / "metadata", "v1\n" + json.dumps(meta, separators=(",", ":")))


def _write_commit(plan: RewritePlan) -> None:
    """The new batch's commit: the last batch's, whose watermark the next batch starts from."""
    commit = (plan.source / "commits" / str(plan.read_batch)).read_text()
    _write_file(plan, plan.output / "commits" / str(plan.write_batch), commit)


def _publish_offsets(plan: RewritePlan) -> None:
    """The one step that makes the checkpoint complete: the real offsets replace the unfinished line,
    once everything else is durable (`sync_names`)."""
    lines, metadata = read_offsets_entry(plan.source, plan.read_batch)
    metadata["conf"] = plan.new_conf
    _write_file(
        plan,
        plan.output / "offsets" / str(plan.write_batch),
        "\n".join([lines[0], json.dumps(metadata), *lines[2:]]) + "\n",
    )


def _verify_our_stores(plan: RewritePlan) -> None:
    """`pystatestore verify --deep` of the new checkpoint: every store's new version restorable,
    every file and every payload stored inside a manifest matching its checksum."""
    from ..reading.checkpoint import open_checkpoint
    from .verification import verify_checkpoint

    report = verify_checkpoint(open_checkpoint(str(plan.output)), deep=True)
    if not report.restorable:
        raise RewriteError(
            f"the new checkpoint does not verify: {'; '.join(str(p) for p in report.problems[:5])}",
            store=str(plan.output),
            version=plan.state_version,
            advice="The output is left unfinished; delete it and report this with the worker logs.",
        )
