"""What a `pystatestore migrate` or `repartition` will do, read from the source checkpoint, and the
names both of its routes share.

`plan_rewrite` checks that a checkpoint can be rewritten (only reading it) and returns the
`RewritePlan`: the last committed batch B whose state is read, the source and target provider and
partition count, and every store (`StoreKind`) to write. The routes that carry a plan out (the
Spark one, rewrite_spark.py, and the direct one, rewrite_direct.py) and the command that picks
between them and finishes the new checkpoint (rewrite.py) import it from here; see
docs/decisions/0026-state-rewrite.md.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from ..spark_minors import PROVIDER_CLASS
from ..store.errors import CheckpointMissingError, StoreConfigError

HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
PROVIDERS = {"pystatestore": PROVIDER_CLASS, "hdfs": HDFS_PROVIDER, "rocksdb": ROCKSDB_PROVIDER}
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
PARTITIONS_CONF = "spark.sql.shuffle.partitions"
FORMAT_VERSION_CONF = "spark.sql.streaming.stateStore.checkpointFormatVersion"
DEFAULT_STORE = "default"
# The first line of offsets/<B+1> while a rewrite runs: Spark reads it as the log's version, fails
# with MALFORMED_LOG_FILE and prints it.
UNFINISHED_LINE = (
    "pystatestore-rewrite-unfinished: this checkpoint was being written by 'pystatestore {command}' and is "
    "not complete; delete this directory and run the command again (its source checkpoint is unchanged)"
)
# Beside the output (on its disk, where the executors exporting Spark's state can write); removed
# before the new checkpoint is finished.
SCRATCH_DIR = ".pystatestore-rewrite"
# The fsyncs of the new checkpoint's files and of the directories naming them (decision 0040).
DATA_POINT = "rewrite:data"
NAME_POINT = "rewrite:name"
# Each operator a rewrite places by key, and how many leading fields of each store's key Spark's
# shuffle hashes (None: all of them). A join's keyWithIndexToValue adds the value's index to the join key;
# a session window's key adds the session to the grouping key, which is its prefix.
_ALL_FIELDS = None
HASHED_KEY_FIELDS: dict[str, Callable[[str, int, int], int | None]] = {
    "stateStoreSave": lambda store, n, prefix: _ALL_FIELDS,
    "dedupe": lambda store, n, prefix: _ALL_FIELDS,
    "dedupeWithinWatermark": lambda store, n, prefix: _ALL_FIELDS,
    "flatMapGroupsWithState": lambda store, n, prefix: _ALL_FIELDS,
    "applyInPandasWithState": lambda store, n, prefix: _ALL_FIELDS,
    "sessionWindowStateStoreSaveExec": lambda store, n, prefix: prefix,
    "symmetricHashJoin": lambda store, n, prefix: n - 1 if store.endswith("keyWithIndexToValue") else _ALL_FIELDS,
}
# A rewrite's progress callback: (what, done, total), as the command's progress bars take it.
Progress = Callable[[str, int, int], None]


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

    def hashed_key_fields(self, num_key_fields: int) -> int:
        """How many leading fields of this store's key (of `num_key_fields`) Spark's shuffle hashes."""
        hashed = HASHED_KEY_FIELDS[self.operator_name](self.store_name, num_key_fields, self.num_cols_prefix_key)
        return num_key_fields if hashed is None else hashed


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
            f"  provider {provider_name(self.source_provider)} -> {provider_name(self.target_provider)}; "
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


@dataclass
class StoreResult:
    """What a route wrote of one store kind: its rows over all target partitions, and how long it took."""

    kind: StoreKind
    rows: int
    partitions: int
    seconds: float


def provider_name(provider: str) -> str:
    """The name the commands give `provider` (pystatestore, hdfs, rocksdb), else its class."""
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


def log_batches(d: Path) -> list[int]:
    """The batches a log directory (offsets/, commits/) has entries for, in order."""
    return (
        sorted(int(p.name) for p in d.iterdir() if p.is_file() and p.name.isascii() and p.name.isdigit())
        if d.is_dir()
        else []
    )


def read_offsets_entry(source: Path, batch: int) -> tuple[list[str], dict[str, Any]]:
    """offsets/<batch>'s lines and its metadata (the second line, JSON)."""
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


def operator_metadata(source: Path, op: int) -> dict[str, Any]:
    """state/<op>/_metadata/metadata: the operator and its stores, as Spark records them."""
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
    planned, committed = log_batches(source / "offsets"), log_batches(source / "commits")
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
    _, metadata = read_offsets_entry(source, last)
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
        meta = operator_metadata(source, op)
        name = str(meta.get("operatorInfo", {}).get("operatorName", "?"))
        if name not in HASHED_KEY_FIELDS:
            raise RewriteError(
                f"operator {op} is {name}, which a rewrite cannot place by key yet "
                f"(it rewrites {', '.join(sorted(HASHED_KEY_FIELDS))})",
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
                for d in [store_dir(state, kind, p)]
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
        doc = json.loads((store_dir(state_root, kind, 0) / "manifests" / f"{version}.json").read_text())
        return str(doc.get("key_encoding", "raw"))
    except (OSError, ValueError, AttributeError):
        return None


def _recorded_keys(state_root: Path, kind: StoreKind, partitions: int, version: int) -> int | None:
    """The store's key count at `version` where its files record it without reading the state:
    pystatestore's manifests and the RocksDB provider's snapshot zips (the HDFS provider keeps none)."""
    total = 0
    for p in range(partitions):
        d = store_dir(state_root, kind, p)
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


def store_dir(state_root: Path, kind: StoreKind, partition: int) -> Path:
    """Where partition `partition` of `kind`'s store lives under `state_root` (a checkpoint's state/)."""
    d = state_root / str(kind.operator_id) / str(partition)
    return d if kind.store_name == DEFAULT_STORE else d / kind.store_name


def output_is_unfinished(checkpoint: Path) -> bool:
    """Whether `checkpoint` is the output of a rewrite that did not finish."""
    offsets = checkpoint / "offsets"
    return any(
        (offsets / str(b)).read_text(errors="replace").startswith(UNFINISHED_LINE.split(":")[0])
        for b in log_batches(offsets)[-1:]
    )
