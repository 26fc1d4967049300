"""`pystatestore migrate` and `repartition`: a checkpoint's state rewritten as one new batch.

Spark keeps a query's provider class and shuffle partition count in its offset log for the life of
the checkpoint, so neither can change by conf. A rewrite reads the state of the last committed
batch B (Spark's state data source, so any provider's files are read by that provider's code),
places every key in the partition Spark's `HashPartitioning` gives it for the target partition
count, and writes it as the target provider's own code writes it (Spark's providers through
their `StateStoreProvider`, the shim's `StateRewrite`; ours by the backend's commit, see
rewrite_direct.py) as the state after a new batch B+1 that reads no input: the same offsets as B, the
conf naming the target provider and partition count. The query restarted on the result goes on
with batch B+2, exactly once. This is what Spark 4.2+'s own offline repartitioning does for its
RocksDB provider; see docs/decisions/0026-state-rewrite.md.

Nothing is lost and nothing is half-done: the source checkpoint is only read; the new one starts
with `offsets/<B+1>` holding one line that Spark refuses as a malformed log and names (so a query
started on an unfinished rewrite fails, naming it), every store written is read back (Spark's
providers through their own code, ours from its files) and compared with what was meant to be
written, and the last step replaces that line by the real offsets.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import pyarrow as pa

from ..spark_minors import PROVIDER_CLASS
from ..store.errors import CheckpointMissingError, StoreConfigError

if TYPE_CHECKING:
    from .rewrite_direct import Source

HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
PROVIDERS = {"pystatestore": PROVIDER_CLASS, "hdfs": HDFS_PROVIDER, "rocksdb": ROCKSDB_PROVIDER}
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
PARTITIONS_CONF = "spark.sql.shuffle.partitions"
FORMAT_VERSION_CONF = "spark.sql.streaming.stateStore.checkpointFormatVersion"
ROCKSDB_CHANGELOG_CONF = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
DEFAULT_STORE = "default"
# The first line of offsets/<B+1> while a rewrite runs: Spark reads it as the log's version, fails
# with MALFORMED_LOG_FILE and prints it.
UNFINISHED_LINE = (
    "pystatestore-rewrite-unfinished: this checkpoint was being written by 'pystatestore {command}' and is "
    "not complete; delete this directory and run the command again (its source checkpoint is unchanged)"
)
SCRATCH_DIR = ".pystatestore-rewrite"
# Each operator pystatestore runs, and which leading fields of each store's key Spark's shuffle
# hashes (None: all of them). A join's keyWithIndexToValue adds the value's index to the join key;
# a session window's key adds the session to the grouping key, which is its prefix.
_ALL_FIELDS = None
_OPERATORS: dict[str, Callable[[str, int, int], int | None]] = {
    "stateStoreSave": lambda store, n, prefix: _ALL_FIELDS,
    "dedupe": lambda store, n, prefix: _ALL_FIELDS,
    "dedupeWithinWatermark": lambda store, n, prefix: _ALL_FIELDS,
    "flatMapGroupsWithState": lambda store, n, prefix: _ALL_FIELDS,
    "applyInPandasWithState": lambda store, n, prefix: _ALL_FIELDS,
    "sessionWindowStateStoreSaveExec": lambda store, n, prefix: prefix,
    "symmetricHashJoin": lambda store, n, prefix: n - 1 if store.endswith("keyWithIndexToValue") else _ALL_FIELDS,
}


class RewriteError(StoreConfigError):
    """A checkpoint this command cannot rewrite, or a target it must not touch."""

    # Most refusals come before anything is written; those after say what to do with the output.
    advice = (
        "Nothing was written and the checkpoint is unchanged: change the command's arguments "
        "(see 'pystatestore migrate --help' and 'pystatestore repartition --help')."
    )


@dataclass(frozen=True)
class StoreKind:
    """One store of an operator (every partition of it): what is read, and how keys are placed."""

    operator_id: int
    operator_name: str
    store_name: str
    num_cols_prefix_key: int

    @property
    def label(self) -> str:
        name = "" if self.store_name == DEFAULT_STORE else f" {self.store_name}"
        return f"operator {self.operator_id} ({self.operator_name}){name}"


@dataclass
class RewritePlan:
    command: str  # migrate | repartition
    source: Path
    output: Path
    read_batch: int  # B: the last committed batch, whose state is read
    source_provider: str
    target_provider: str
    source_partitions: int
    target_partitions: int
    conf: dict[str, str]  # offsets/<B>'s SQL confs
    stores: list[StoreKind]
    bytes_by_store: dict[StoreKind, int] = field(default_factory=dict)
    keys_by_store: dict[StoreKind, int] = field(default_factory=dict)  # where the checkpoint records them
    key_encodings: dict[StoreKind, str] = field(default_factory=dict)  # pystatestore sources: how keys are stored

    @property
    def write_batch(self) -> int:
        return self.read_batch + 1

    @property
    def state_version(self) -> int:
        """The store version holding the state after the new batch."""
        return self.write_batch + 1

    @property
    def new_conf(self) -> dict[str, str]:
        return {**self.conf, PROVIDER_CONF: self.target_provider, PARTITIONS_CONF: str(self.target_partitions)}

    def describe(self) -> list[str]:
        lines = [
            f"{self.command} {self.source} -> {self.output}",
            f"  state of batch {self.read_batch} (version {self.read_batch + 1}), written as batch {self.write_batch} "
            f"(version {self.state_version}) that reads no input",
            f"  provider {_short(self.source_provider)} -> {_short(self.target_provider)}; "
            f"partitions {self.source_partitions} -> {self.target_partitions}",
        ]
        for s in self.stores:
            size, keys = self.bytes_by_store.get(s), self.keys_by_store.get(s)
            lines.append(
                f"  {s.label}: {self.source_partitions} -> {self.target_partitions} partitions"
                + (f", {keys:,} keys" if keys is not None else "")
                + (f", {size:,} bytes in the source" if size is not None else "")
            )
        lines.append(
            f"  writes {self.output}: metadata, offsets/0..{self.write_batch}, commits/0..{self.write_batch}, "
            f"sources/, state/ (operator metadata, schemas, {len(self.stores) * self.target_partitions} stores)"
        )
        return lines


def _short(provider: str) -> str:
    return next((name for name, cls in PROVIDERS.items() if cls == provider), provider)


def _local_dir(uri: str, what: str) -> Path:
    parsed = urlparse(uri)
    if parsed.scheme not in ("", "file"):
        raise RewriteError(
            f"the {what} is not on a local file system ({parsed.scheme}://): rewrites read and write local "
            "checkpoints (a mounted file system included)",
            store=uri,
            advice="Copy the checkpoint to a local directory, rewrite it there, and copy the result back.",
        )
    return Path(parsed.path if parsed.scheme else uri).resolve()


def _numbered(d: Path) -> list[int]:
    return (
        sorted(int(p.name) for p in d.iterdir() if p.is_file() and p.name.isascii() and p.name.isdigit())
        if d.is_dir()
        else []
    )


def _offsets_conf(source: Path, batch: int) -> tuple[list[str], dict[str, Any]]:
    path = source / "offsets" / str(batch)
    lines = path.read_text().splitlines()
    if len(lines) < 2 or not lines[0].startswith("v"):
        raise RewriteError(
            "the offset log entry is not one Spark wrote (no version line and metadata)",
            store=str(source),
            file=f"offsets/{batch}",
            advice="Only checkpoints of Spark 4.1 or later can be rewritten.",
        )
    try:
        metadata = json.loads(lines[1])
    except json.JSONDecodeError as e:
        raise RewriteError(
            f"the offset log's metadata is not JSON: {e}",
            store=str(source),
            file=f"offsets/{batch}",
            advice="Nothing was written: the checkpoint's offset log is damaged or was not written by Spark.",
        ) from None
    return lines, metadata


def _operator_metadata(source: Path, op: int) -> dict[str, Any]:
    path = source / "state" / str(op) / "_metadata" / "metadata"
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise RewriteError(
            "the operator has no metadata file (Spark writes it since 4.0)",
            store=str(source),
            file=f"state/{op}/_metadata/metadata",
            advice="Run the query on Spark 4.1 or later for one batch first, then rewrite it.",
        ) from None
    if not lines or lines[0] != "v1":
        raise RewriteError(
            f"operator metadata {lines[0] if lines else '(empty)'} is not version 1: transformWithState's operators "
            "cannot be rewritten yet",
            store=str(source),
            file=f"state/{op}/_metadata/metadata",
        )
    return json.loads(lines[1])


def plan_rewrite(
    command: str,
    checkpoint: str,
    output: str,
    *,
    to: str | None = None,
    partitions: int | None = None,
) -> RewritePlan:
    """Checks that `checkpoint` can be rewritten to `output` and says how. Reads only."""
    source = _local_dir(checkpoint, "checkpoint")
    out = _local_dir(output, "output")
    if not (source / "offsets").is_dir() or not (source / "commits").is_dir():
        raise CheckpointMissingError(
            "this directory is not a Spark streaming checkpoint (it has no offsets/ or commits/)",
            store=str(source),
            advice="Nothing was written: pass the query's checkpointLocation, the directory holding offsets/, "
            "commits/ and state/.",
        )
    if out.exists():
        raise RewriteError(
            "the output exists: a rewrite writes a new checkpoint and never touches an existing directory",
            store=str(out),
            advice="Name a directory that does not exist yet.",
        )
    if out == source or source in out.parents:
        raise RewriteError("the output must be outside the source checkpoint", store=str(out))
    planned, committed = _numbered(source / "offsets"), _numbered(source / "commits")
    if output_is_unfinished(source):
        raise RewriteError(
            "this checkpoint is the unfinished output of an interrupted rewrite",
            store=str(source),
            file=f"offsets/{planned[-1]}",
            advice="Delete it and rewrite its source checkpoint again.",
        )
    if not committed:
        raise RewriteError(
            "the query has committed no batch: there is no state to rewrite", store=str(source), file="commits/"
        )
    last = committed[-1]
    if planned and planned[-1] > last:
        raise RewriteError(
            f"batch {planned[-1]} is planned but not committed: the query is running, or stopped in the middle of "
            "a batch",
            store=str(source),
            file=f"offsets/{planned[-1]}",
            advice="Stop the query and let it finish its batch (restart it once if it failed), then rewrite.",
        )
    _, metadata = _offsets_conf(source, last)
    conf = {str(k): str(v) for k, v in metadata.get("conf", {}).items()}
    if conf.get(FORMAT_VERSION_CONF, "1") != "1":
        raise RewriteError(
            f"the checkpoint uses state checkpoint format version {conf[FORMAT_VERSION_CONF]}, which rewrites do not "
            "support yet",
            store=str(source),
            file=f"offsets/{last}",
        )
    source_provider = conf.get(PROVIDER_CONF, HDFS_PROVIDER)
    source_partitions = int(conf.get(PARTITIONS_CONF, "200"))
    if command == "migrate":
        if to not in PROVIDERS:
            raise RewriteError(f"unknown target provider {to!r}: one of {', '.join(PROVIDERS)}", store=str(source))
        target_provider, target_partitions = PROVIDERS[to], source_partitions
        if target_provider == source_provider:
            raise RewriteError(
                f"the checkpoint already uses {to} ({source_provider})", store=str(source), file=f"offsets/{last}"
            )
    else:
        if partitions is None or partitions < 1:
            raise RewriteError("the partition count must be at least 1", store=str(source))
        target_provider, target_partitions = source_provider, partitions
        if partitions == source_partitions:
            raise RewriteError(
                f"the checkpoint already has {partitions} partitions", store=str(source), file=f"offsets/{last}"
            )
    if source_provider not in PROVIDERS.values():
        raise RewriteError(
            f"the checkpoint's provider {source_provider} is not one a rewrite reads (pystatestore, Spark's HDFS or "
            "RocksDB provider)",
            store=str(source),
            file=f"offsets/{last}",
        )
    stores: list[StoreKind] = []
    sizes: dict[StoreKind, int] = {}
    state = source / "state"
    operators = (
        sorted(int(p.name) for p in state.iterdir() if p.is_dir() and p.name.isdigit()) if state.is_dir() else []
    )
    if not operators:
        raise RewriteError("the query keeps no state: there is nothing to rewrite", store=str(source), file="state/")
    for op in operators:
        meta = _operator_metadata(source, op)
        name = str(meta.get("operatorInfo", {}).get("operatorName", "?"))
        if name not in _OPERATORS:
            raise RewriteError(
                f"operator {op} is {name}, which a rewrite cannot place by key yet "
                f"(it rewrites {', '.join(sorted(_OPERATORS))})",
                store=str(source),
                file=f"state/{op}/_metadata/metadata",
            )
        for info in meta.get("stateStoreInfo", []):
            recorded = int(info.get("numPartitions", source_partitions))
            if recorded != source_partitions:
                raise RewriteError(
                    f"operator {op} records {recorded} partitions, the offset log {source_partitions}",
                    store=str(source),
                    file=f"state/{op}/_metadata/metadata",
                )
            kind = StoreKind(op, name, str(info.get("storeName", DEFAULT_STORE)), int(info.get("numColsPrefixKey", 0)))
            stores.append(kind)
            sizes[kind] = sum(
                f.stat().st_size
                for p in range(source_partitions)
                for d in [_store_dir(state, kind, p)]
                if d.is_dir()
                for f in d.rglob("*")
                if f.is_file() and "_metadata" not in f.relative_to(d).parts
            )
    keys = {kind: n for kind in stores if (n := _recorded_keys(state, kind, source_partitions, last + 1)) is not None}
    encodings = {kind: e for kind in stores if (e := _recorded_key_encoding(state, kind, last + 1)) is not None}
    return RewritePlan(
        command,
        source,
        out,
        last,
        source_provider,
        target_provider,
        source_partitions,
        target_partitions,
        conf,
        stores,
        sizes,
        keys,
        encodings,
    )


def _recorded_key_encoding(state_root: Path, kind: StoreKind, version: int) -> str | None:
    """How a pystatestore store records its keys (its partition 0's manifest of `version`)."""
    try:
        doc = json.loads((_store_dir(state_root, kind, 0) / "manifests" / f"{version}.json").read_text())
        return str(doc.get("key_encoding", "raw"))
    except (OSError, ValueError, AttributeError):
        return None


def _recorded_keys(state_root: Path, kind: StoreKind, partitions: int, version: int) -> int | None:
    """The store's key count at `version` where its files record it without reading the state:
    pystatestore's manifests and the RocksDB provider's snapshot zips (the HDFS provider keeps none)."""
    total = 0
    for p in range(partitions):
        d = _store_dir(state_root, kind, p)
        manifest, snapshot = d / "manifests" / f"{version}.json", d / f"{version}.zip"
        try:
            if manifest.is_file():
                total += int(json.loads(manifest.read_text())["num_keys"])
            elif snapshot.is_file():
                with zipfile.ZipFile(snapshot) as z:
                    total += int(json.loads(z.read("metadata").decode().splitlines()[1])["numKeys"])
            else:
                return None
        except (OSError, KeyError, ValueError, IndexError, zipfile.BadZipFile):
            return None
    return total


def _store_dir(state_root: Path, kind: StoreKind, partition: int) -> Path:
    d = state_root / str(kind.operator_id) / str(partition)
    return d if kind.store_name == DEFAULT_STORE else d / kind.store_name


# -- the new checkpoint's files -------------------------------------------------------------------


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dst)


def _copy_log(src_dir: Path, dst_dir: Path, batches: list[int]) -> None:
    """Log entries 0..B with Hadoop's checksum files, so the copy reads as the source does."""
    for b in batches:
        _copy(src_dir / str(b), dst_dir / str(b))
        crc = src_dir / f".{b}.crc"
        if crc.is_file():
            _copy(crc, dst_dir / crc.name)


def _write_file(path: Path, text: str) -> None:
    """Written whole to a temporary name, then renamed: a reader sees the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _start_output(plan: RewritePlan) -> None:
    out, src, b = plan.output, plan.source, plan.read_batch
    (out / "offsets").mkdir(parents=True)
    # First of all: a query started on this directory now fails, naming what it is.
    _write_file(out / "offsets" / str(plan.write_batch), UNFINISHED_LINE.format(command=plan.command) + "\n")
    _copy(src / "metadata", out / "metadata")
    _copy_log(src / "offsets", out / "offsets", [x for x in _numbered(src / "offsets") if x <= b])
    _copy_log(src / "commits", out / "commits", [x for x in _numbered(src / "commits") if x <= b])
    if (src / "sources").is_dir():
        shutil.copytree(src / "sources", out / "sources")
    for op in sorted({s.operator_id for s in plan.stores}):
        src_op, out_op = src / "state" / str(op), out / "state" / str(op)
        # Operator metadata and schema files; Spark reads store schemas from partition 0 only.
        for sub in ("_metadata", "_stateSchema"):
            if (src_op / sub).is_dir():
                shutil.copytree(src_op / sub, out_op / sub)
        for meta_dir in sorted((src_op / "0").rglob("_metadata")) if (src_op / "0").is_dir() else []:
            if meta_dir.is_dir():
                shutil.copytree(meta_dir, out_op / "0" / meta_dir.relative_to(src_op / "0"))
        meta = _operator_metadata(src, op)
        for info in meta.get("stateStoreInfo", []):
            info["numPartitions"] = plan.target_partitions
        (out_op / "_metadata" / ".metadata.crc").unlink(missing_ok=True)  # the content changes
        _write_file(out_op / "_metadata" / "metadata", "v1\n" + json.dumps(meta, separators=(",", ":")))


def _write_commit(plan: RewritePlan) -> None:
    """The new batch's commit: the last batch's, whose watermark the next batch starts from."""
    commit = (plan.source / "commits" / str(plan.read_batch)).read_text()
    _write_file(plan.output / "commits" / str(plan.write_batch), commit)


def _publish_offsets(plan: RewritePlan) -> None:
    """The one step that makes the checkpoint complete: the real offsets replace the unfinished line."""
    lines, metadata = _offsets_conf(plan.source, plan.read_batch)
    metadata["conf"] = plan.new_conf
    _write_file(
        plan.output / "offsets" / str(plan.write_batch), "\n".join([lines[0], json.dumps(metadata), *lines[2:]]) + "\n"
    )


def _verify_our_stores(plan: RewritePlan) -> None:
    """`pystatestore verify --deep` of the new checkpoint: every store's new version restorable,
    every file and every payload stored inside a manifest matching its checksum."""
    from .checkpoint import open_checkpoint
    from .verification import verify_checkpoint

    report = verify_checkpoint(open_checkpoint(str(plan.output)), deep=True)
    if not report.restorable:
        raise RewriteError(
            f"the new checkpoint does not verify: {'; '.join(str(p) for p in report.problems[:5])}",
            store=str(plan.output),
            version=plan.state_version,
            advice="The output is left unfinished; delete it and report this with the worker logs.",
        )


def output_is_unfinished(checkpoint: Path) -> bool:
    """Whether `checkpoint` is the output of a rewrite that did not finish."""
    offsets = checkpoint / "offsets"
    return any(
        (offsets / str(b)).read_text(errors="replace").startswith(UNFINISHED_LINE.split(":")[0])
        for b in _numbered(offsets)[-1:]
    )


# -- moving Spark providers' version 1 into place ---------------------------------------------


def _place_spark_version(plan: RewritePlan, kind: StoreKind, scratch_state: Path) -> None:
    """Spark's providers write a store's whole state only as their first version: the scratch
    store's version 1 becomes version `state_version` of the real store. The HDFS provider's first
    delta holds only puts, as a snapshot does (both are its key-value record stream); the RocksDB
    provider's version 1 is a zip naming SST files by unique names, with no version inside."""
    v = plan.state_version
    for p in range(plan.target_partitions):
        src, dst = _store_dir(scratch_state, kind, p), _store_dir(plan.output / "state", kind, p)
        dst.mkdir(parents=True, exist_ok=True)
        if plan.target_provider == HDFS_PROVIDER:
            moves = {"1.delta": f"{v}.snapshot"}
        else:
            moves = {"1.zip": f"{v}.zip"}
            for sst in sorted((src / "SSTs").glob("*")) if (src / "SSTs").is_dir() else []:
                moves[f"SSTs/{sst.name}"] = f"SSTs/{sst.name}"
        for name, new in moves.items():
            if name.startswith("SSTs/.") or name.endswith(".crc"):
                continue
            if not (src / name).is_file():
                raise RewriteError(
                    f"the {_short(plan.target_provider)} provider wrote no {name} for {kind.label} partition {p}",
                    store=str(src),
                    file=name,
                    advice="The output is left unfinished; delete it and report this with the Spark log.",
                )
            (dst / new).parent.mkdir(parents=True, exist_ok=True)
            (src / name).replace(dst / new)
            crc = (src / name).with_name(f".{Path(name).name}.crc")
            if crc.is_file():
                crc.replace((dst / new).with_name(f".{Path(new).name}.crc"))


# -- running it -------------------------------------------------------------------------------


@dataclass
class StoreResult:
    kind: StoreKind
    rows: int
    partitions: int
    seconds: float


def _summaries(lines: Any) -> tuple[dict[int, tuple[int, str]], int]:
    """The shim's per-partition summaries as {partition: (rows, digest)}, and the misplaced rows."""
    out: dict[int, tuple[int, str]] = {}
    misplaced = 0
    for line in lines:
        doc = json.loads(str(line))
        out[int(doc["partition"])] = (int(doc["rows"]), str(doc["digest"]))
        misplaced += int(doc.get("misplaced", 0))
    return out, misplaced


def _store_spec(writer: Any, state_root: Path, kind: StoreKind, schemas: tuple[str, str], conf: dict[str, str]) -> Any:
    """The shim's StoreSpec of `kind` under `state_root`, for a provider running with `conf`."""
    key_json, value_json = schemas
    return writer.storeSpec(
        str(state_root), kind.operator_id, kind.store_name, key_json, value_json, kind.num_cols_prefix_key, conf
    )


def rewrite(plan: RewritePlan, spark: Any, progress: Callable[[str, int, int], None]) -> list[StoreResult]:
    """Runs `plan`: in `spark` (a local session with the shim jar and adaptive execution off), or
    without it where both ends are pystatestore (`spark` may then be None)."""
    from .rewrite_direct import rewrite_our_stores, runs_without_spark

    direct = runs_without_spark(plan)
    if not direct and (spark is None or spark.conf.get("spark.sql.adaptive.enabled") != "false"):
        raise RewriteError(
            "the rewrite needs a Spark session with spark.sql.adaptive.enabled=false", store=str(plan.output)
        )
    source_commits = _numbered(plan.source / "commits")[-1:]
    _start_output(plan)
    if direct:
        results = rewrite_our_stores(plan, progress)
    elif plan.target_provider == PROVIDER_CLASS:
        results = rewrite_our_stores(plan, progress, partial(_exported_source, plan, spark, progress))
    else:
        results = _rewrite_in_spark(plan, spark, progress)
    if (
        _numbered(plan.source / "commits")[-1:] != source_commits
        or _numbered(plan.source / "offsets")[-1] > plan.read_batch
    ):
        raise RewriteError(
            "the source checkpoint's logs moved while it was rewritten: a query is running on it",
            store=str(plan.source),
            advice="Stop the query, delete the output, and run the command again.",
        )
    shutil.rmtree(plan.output / SCRATCH_DIR, ignore_errors=True)
    _write_commit(plan)
    if plan.target_provider == PROVIDER_CLASS:
        _verify_our_stores(plan)
    _publish_offsets(plan)
    return results


def _state_reader(plan: RewritePlan, spark: Any, kind: StoreKind) -> Any:
    """Spark's state data source over the last committed batch's state of `kind`'s stores."""
    return (
        spark.read.format("statestore")
        .option("batchId", plan.read_batch)
        .option("operatorId", kind.operator_id)
        .option("storeName", kind.store_name)
        .load(str(plan.source))
    )


def _exported_source(
    plan: RewritePlan, spark: Any, progress: Callable[[str, int, int], None], kind: StoreKind, work: Path
) -> Source:
    """The state of `kind`'s source stores read by Spark's state reader (so by the source
    provider's own code) and exported by the shim into `work` as the bytes our store keeps."""
    from .rewrite_direct import Source, stored_key_encoding

    what = f"exporting {kind.label} with Spark's state reader"
    progress(what, 0, 1)

    writer = spark._jvm.org.pystatestore.StateRewrite
    reader = _state_reader(plan, spark, kind)
    schemas = (reader.schema["key"].dataType.json(), reader.schema["value"].dataType.json())
    spec = _store_spec(writer, plan.source / "state", kind, schemas, {})
    encoding = stored_key_encoding(kind, plan.new_conf)
    exported = writer.export(reader._jdf, plan.source_partitions, spec, encoding, str(work))
    rows = {int(doc["partition"]): int(doc["rows"]) for doc in map(json.loads, map(str, exported))}
    progress(what, 1, 1)

    def state(p: int) -> pa.Table:
        path = work / f"source-{p}.arrow"
        expected = rows.get(p)
        table = None
        if path.is_file():
            with pa.OSFile(str(path)) as f:
                table = pa.ipc.open_stream(f).read_all().select(["key", "value"])
            path.unlink()  # its keys are placed next, into a file of their own
        if table is None or table.num_rows != expected:
            raise RewriteError(
                f"{kind.label} partition {p}: the shim's export of Spark's state reader "
                + ("left no file" if table is None else f"holds {table.num_rows} rows")
                + (f", but the reader gave {expected} rows" if expected is not None else " and no summary"),
                store=str(plan.source),
                file=f"state/{kind.operator_id}/{p}",
                advice="The output is left unfinished; delete it and report this with the Spark log.",
            )
        return table

    return Source(state, (str(spec.keySchema().json()), str(spec.valueSchema().json()), encoding))


def _rewrite_in_spark(plan: RewritePlan, spark: Any, progress: Callable[[str, int, int], None]) -> list[StoreResult]:
    """Every store of `plan` (the target one of Spark's providers) read with Spark's state reader,
    placed by Spark's shuffle and written through the target provider's own code (the shim's
    StateRewrite) as its first version, moved into place, then read back through it."""
    from pyspark.sql import functions as F

    writer = spark._jvm.org.pystatestore.StateRewrite
    scratch = plan.output / SCRATCH_DIR
    results: list[StoreResult] = []
    for i, kind in enumerate(plan.stores):
        progress("rewriting stores", i, len(plan.stores))
        started = time.perf_counter()
        reader = _state_reader(plan, spark, kind)
        key_type = reader.schema["key"].dataType
        fields = [f.name for f in key_type.fields]
        hashed = _OPERATORS[kind.operator_name](kind.store_name, len(fields), kind.num_cols_prefix_key)
        shuffle_cols = [F.col("key").getField(name) for name in fields[: hashed if hashed is not None else len(fields)]]
        # Every key must sit where Spark's shuffle put it: the check that the columns above are the
        # ones Spark hashes, on this very data, made in the same pass that writes.
        misplaced = F.pmod(F.hash(*shuffle_cols), F.lit(plan.source_partitions)) != F.col("partition_id")
        placed = reader.select("key", "value", misplaced.alias("misplaced")).repartition(
            plan.target_partitions, *shuffle_cols
        )
        schemas = (key_type.json(), reader.schema["value"].dataType.json())
        conf = dict(plan.new_conf)
        if plan.target_provider == ROCKSDB_PROVIDER:
            conf[ROCKSDB_CHANGELOG_CONF] = "false"  # version 1 as a snapshot zip, written at commit
        write_spec = _store_spec(writer, scratch / "state", kind, schemas, conf)
        written, misplaced_rows = _summaries(writer.write(placed._jdf, plan.target_partitions, write_spec))
        if misplaced_rows:
            raise RewriteError(
                f"{misplaced_rows} keys of {kind.label} are not in the partition Spark's hash of "
                f"{len(shuffle_cols)} key columns gives: this operator's keys cannot be placed by a rewrite",
                store=str(plan.source),
                file=f"state/{kind.operator_id}",
                advice="The output is left unfinished; delete it. Report the operator: its keys need another rule.",
            )
        _place_spark_version(plan, kind, scratch / "state")
        read_spec = _store_spec(writer, plan.output / "state", kind, schemas, plan.new_conf)
        read_back, _ = _summaries(
            writer.readBack(spark._jsparkSession, plan.target_partitions, read_spec, plan.state_version)
        )
        if read_back != written:
            bad = sorted(p for p in written if read_back.get(p) != written[p])
            raise RewriteError(
                f"{kind.label}: partitions {bad[:10]} read back other rows than were written "
                f"(written {[written[p] for p in bad[:3]]}, read {[read_back.get(p) for p in bad[:3]]})",
                store=str(plan.output),
                version=plan.state_version,
                advice="The output is left unfinished; delete it and report this with the worker logs.",
            )
        total = sum(rows for rows, _ in written.values())
        results.append(StoreResult(kind, total, plan.target_partitions, time.perf_counter() - started))
    progress("rewriting stores", len(plan.stores), len(plan.stores))
    return results
