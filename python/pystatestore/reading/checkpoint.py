"""A Spark streaming checkpoint as the tools see it, read without Spark or a JVM.

Spark's layout: `metadata` (the query id), `offsets/<batch>` (each planned batch, with the SQL
confs the query runs with), `commits/<batch>` (each finished batch) and `state/<operator>/
<partition>[/<store name>]/`, one directory per state store. pystatestore's stores hold
`manifests/<version>.json` (checkpoint format v2: `manifests/<version>-<id>.json`, one per attempt,
the commit log naming each batch's); the state of batch b is version b + 1. This module finds the batches,
operators, partitions and stores; store_reader.py opens a store's backend read-only. The tools
write nothing into the checkpoint.
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow._fs as pafs

from ..store.errors import CheckpointMissingError, StoreConfigError
from ..store.manifest import MANIFEST_DIR
from ..store.remote import RemoteStore, describe_foreign_layout, filesystem_for, join_uri

DEFAULT_STORE_NAME = "default"
OUR_PROVIDER = "org.pystatestore.PythonStateStoreProvider"
_NUMBER = re.compile(r"^\d+$")


@dataclass(frozen=True)
class StoreLocation:
    """One state store of the checkpoint: an operator's partition's store (joins have four)."""

    operator_id: int
    partition_id: int
    store_name: str
    uri: str  # the store directory, as Spark names it (file:/..., s3a://...)
    foreign: str | None = None  # another provider's files found here instead of manifests
    # Checkpoint format v2: (version, checkpoint id) of each committed batch's attempt, from the commit log.
    attempts: tuple[tuple[int, str], ...] = ()

    @property
    def label(self) -> str:
        name = "" if self.store_name == DEFAULT_STORE_NAME else f"/{self.store_name}"
        return f"operator {self.operator_id} partition {self.partition_id}{name}"


@dataclass
class SparkCheckpoint:
    """The query-level part of a checkpoint: its batches and its state stores."""

    uri: str
    query_id: str | None
    planned_batches: list[int]  # offsets/
    committed_batches: list[int]  # commits/
    conf: dict[str, str] = field(default_factory=dict)  # the SQL confs of the last planned batch
    stores: list[StoreLocation] = field(default_factory=list)

    @property
    def last_committed_batch(self) -> int | None:
        return self.committed_batches[-1] if self.committed_batches else None

    @property
    def committed_span(self) -> str:
        """The committed batches as `first..last` (or `none`)."""
        return _ranges(self.committed_batches)

    @property
    def provider(self) -> str | None:
        return self.conf.get("spark.sql.streaming.stateStore.providerClass")

    def operators(self) -> list[int]:
        return sorted({s.operator_id for s in self.stores})

    def stores_of(self, operator: int | None = None) -> list[StoreLocation]:
        return [s for s in self.stores if operator is None or s.operator_id == operator]

    def version_of_batch(self, batch: int | None) -> int:
        """The store version holding the state after `batch` (default: the last committed one)."""
        if batch is None:
            batch = self.last_committed_batch
            if batch is None:
                raise CheckpointMissingError(
                    "the query has not committed a batch yet: there is no state to read",
                    store=self.uri,
                    file="commits/",
                )
        elif batch not in self.committed_batches:
            raise CheckpointMissingError(
                f"batch {batch} is not in the commit log (committed: {_ranges(self.committed_batches)})",
                store=self.uri,
                file=f"commits/{batch}",
                advice="Pick a committed batch; Spark keeps the last spark.sql.streaming.minBatchesToRetain.",
            )
        return batch + 1


def _ranges(numbers: list[int]) -> str:
    if not numbers:
        return "none"
    return f"{numbers[0]}..{numbers[-1]}" if len(numbers) > 1 else str(numbers[0])


def _child_names(fs: pafs.FileSystem, path: str, kind: pafs.FileType) -> list[str]:
    infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    return sorted(posixpath.basename(i.path) for i in infos if i.type == kind)


def _read_text(fs: pafs.FileSystem, path: str) -> str | None:
    try:
        with fs.open_input_stream(path) as f:
            return f.read().decode("utf-8", errors="replace")
    except (FileNotFoundError, OSError):
        return None


def checkpoint_uri(uri: str) -> str:
    """`uri` as the tools name a checkpoint: a local path becomes `file:` and absolute."""
    if "://" not in uri and not uri.startswith("file:"):
        return "file:" + str(Path(uri).resolve())
    return uri


def batches_in(fs: pafs.FileSystem, root: str, log: str) -> list[int]:
    """The batches of Spark's `offsets` or `commits` log, in order."""
    return sorted(int(n) for n in _child_names(fs, posixpath.join(root, log), pafs.FileType.File) if _NUMBER.match(n))


def planned_conf(fs: pafs.FileSystem, root: str, batch: int) -> dict[str, str]:
    """The SQL confs the offsets log records for `batch` (the query's shuffle partitions among them)."""
    text = _read_text(fs, posixpath.join(root, "offsets", str(batch))) or ""
    lines = text.splitlines()
    try:
        return {str(k): str(v) for k, v in json.loads(lines[1]).get("conf", {}).items()}
    except (json.JSONDecodeError, IndexError, AttributeError):
        return {}


def query_id_of(fs: pafs.FileSystem, root: str) -> str | None:
    """The query id Spark's `metadata` file records (None when it is missing or unreadable)."""
    metadata = _read_text(fs, posixpath.join(root, "metadata"))
    if not metadata:
        return None
    try:
        found = json.loads(metadata.splitlines()[0]).get("id")
    except (json.JSONDecodeError, IndexError, AttributeError):
        return None
    return str(found) if found is not None else None


def open_checkpoint(uri: str) -> SparkCheckpoint:
    """Reads a checkpoint's layout. `uri` is what the query's `checkpointLocation` was: a local
    path, `file:`, or anything `pyarrow.fs` opens (s3://, gs://, hdfs://)."""
    uri = checkpoint_uri(uri)
    fs, root = filesystem_for(uri)
    if fs.get_file_info(root).type != pafs.FileType.Directory:
        raise CheckpointMissingError("there is no checkpoint directory here", store=uri)
    names = set(_child_names(fs, root, pafs.FileType.Directory))
    if not names & {"offsets", "commits", "state"}:
        raise StoreConfigError(
            "this directory is not a Spark streaming checkpoint (it has no offsets/, commits/ or state/)",
            store=uri,
            advice="Pass the query's checkpointLocation, the directory that holds offsets/, commits/ and state/.",
        )
    query_id = query_id_of(fs, root)
    planned, committed = batches_in(fs, root, "offsets"), batches_in(fs, root, "commits")
    conf = planned_conf(fs, root, planned[-1]) if planned else {}
    ckpt = SparkCheckpoint(uri=uri, query_id=query_id, planned_batches=planned, committed_batches=committed, conf=conf)
    attempts = commit_log_attempts(fs, root, committed)
    state = posixpath.join(root, "state")
    for op in _child_names(fs, state, pafs.FileType.Directory):
        if not _NUMBER.match(op):
            continue  # _metadata, _stateSchema
        for part in _child_names(fs, posixpath.join(state, op), pafs.FileType.Directory):
            if not _NUMBER.match(part):
                continue
            part_dir = posixpath.join(state, op, part)
            children = _child_names(fs, part_dir, pafs.FileType.Directory)
            found = []
            if MANIFEST_DIR in children or not any(_is_store(fs, posixpath.join(part_dir, c)) for c in children):
                found.append((DEFAULT_STORE_NAME, join_uri(uri, "state", op, part)))
            found += [
                (c, join_uri(uri, "state", op, part, c)) for c in children if _is_store(fs, posixpath.join(part_dir, c))
            ]
            for name, store_uri in found:
                remote = RemoteStore(store_uri)
                foreign = None if remote.exists(MANIFEST_DIR) else describe_foreign_layout(remote)
                named = tuple(attempts.get((int(op), int(part), name), ()))
                ckpt.stores.append(StoreLocation(int(op), int(part), name, store_uri, foreign, named))
    ckpt.stores.sort(key=lambda s: (s.operator_id, s.partition_id, s.store_name))
    return ckpt


# The order of a stream-stream join's stores in Spark's commit log (SymmetricHashJoinStateManager).
JOIN_STORE_NAMES = (
    "left-keyToNumValues",
    "left-keyWithIndexToValue",
    "right-keyToNumValues",
    "right-keyWithIndexToValue",
)


def commit_log_attempts(
    fs: pafs.FileSystem, root: str, committed: list[int]
) -> dict[tuple[int, int, str], list[tuple[int, str]]]:
    """(operator, partition, store name) -> [(version, checkpoint id)] from the commit log of a query
    run with checkpoint format v2 (`stateUniqueIds`); empty for format v1."""
    found: dict[tuple[int, int, str], list[tuple[int, str]]] = {}
    for batch in committed:
        text = _read_text(fs, posixpath.join(root, "commits", str(batch))) or ""
        lines = text.splitlines()
        try:
            ids = json.loads(lines[1]).get("stateUniqueIds") if len(lines) > 1 else None
        except (json.JSONDecodeError, AttributeError):
            ids = None
        if not isinstance(ids, dict):
            continue
        for op, partitions in ids.items():
            for partition, names in enumerate(partitions or []):
                stores = JOIN_STORE_NAMES if len(names) == len(JOIN_STORE_NAMES) else (DEFAULT_STORE_NAME,)
                for name, cid in zip(stores, names, strict=False):
                    found.setdefault((int(op), partition, name), []).append((batch + 1, str(cid)))
    return found


def _is_store(fs: pafs.FileSystem, path: str) -> bool:
    return MANIFEST_DIR in _child_names(fs, path, pafs.FileType.Directory)
