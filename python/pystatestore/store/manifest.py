"""Manifests: a version's commit point (DESIGN §3), written last and atomically.

A *snapshot* manifest lists every file the version needs with its size and checksum; files under a
size threshold are stored inside it (base64), as Flink keeps small state handles inside its
checkpoint metadata. A *changelog* manifest holds the version's changes (inline when small, else in
a `changelog/` file) and names the manifest of the version they apply to: the version is that
version plus these changes. Reading a manifest validates its structure, every path in it and every
logical file name (which becomes a local file name) before anything else trusts it.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import socket
import time
import uuid
from dataclasses import dataclass, field, fields
from typing import Any

from .checksums import checksum
from .errors import CheckpointDamagedError, InvalidPathError
from .remote import validate_file_name, validate_relative_path

# Format 3 adds changelog manifests and files stored inline; format 2 records how keys are stored
# (`key_encoding`); format 1 (releases before 0.3.0) always stored Spark's key bytes as they are.
FORMAT_VERSION = 3
READABLE_FORMATS = (1, 2, 3)
MANIFEST_DIR = "manifests"
# Snapshots of changelog versions, made later by maintenance: snapshots/<version>-<manifest id>.json
SNAPSHOT_DIR = "snapshots"
KIND_SNAPSHOT = "snapshot"
KIND_CHANGELOG = "changelog"
KEY_ENCODING_RAW = "raw"
# A prefix-scan store's keys: 4-byte big-endian length of the prefix row, the prefix row's bytes,
# then the whole key row's bytes, so a prefix scan is a seek over a byte prefix (DESIGN §2).
KEY_ENCODING_PREFIX = "prefix-v1"
# A store with column families (transformWithState): each key is a 2-byte big-endian family id,
# then the key as its family's encoder lays it out; family 0 is the registry of the others
# (name -> id, encoding, schemas). The worker stores the keys as they come.
KEY_ENCODING_FAMILIES = "families-v1"
KEY_ENCODINGS = (KEY_ENCODING_RAW, KEY_ENCODING_PREFIX, KEY_ENCODING_FAMILIES)
# Fields a changelog manifest leaves out when they hold these values (from_json's defaults).
_DEFAULTS: dict[str, Any] = {"column_families": ["default"], "key_encoding": KEY_ENCODING_RAW, "num_internal_keys": 0}
_MANIFEST_NAME = re.compile(r"^(\d+)(?:-([0-9A-Za-z_.-]+))?\.json$")


def manifest_path(version: int, checkpoint_id: str | None = None) -> str:
    return (
        f"{MANIFEST_DIR}/{version}.json" if checkpoint_id is None else f"{MANIFEST_DIR}/{version}-{checkpoint_id}.json"
    )


# A checkpoint id (Spark's checkpoint format v2) is the manifest id of the attempt it names. Spark
# hands ids back from its commit log: anything else is refused before it becomes part of a path.
_CHECKPOINT_ID = re.compile(r"^[0-9a-f]{32}$")


def is_checkpoint_id(value: str) -> bool:
    return bool(_CHECKPOINT_ID.match(value))


def snapshot_path(version: int, manifest_id: str) -> str:
    """Where maintenance publishes the snapshot of changelog version `version` (attempt `manifest_id`)."""
    return f"{SNAPSHOT_DIR}/{version}-{manifest_id}.json"


_SNAPSHOT_NAME = re.compile(r"^(\d+)-([0-9a-f]{32})\.json$")


def snapshot_of(path: str) -> tuple[int, str] | None:
    """(version, manifest id) of a snapshot manifest's path, or None for other files."""
    m = _SNAPSHOT_NAME.match(path.rsplit("/", 1)[-1])
    return (int(m.group(1)), m.group(2)) if m else None


def checkpoint_id_of_manifest(name: str) -> str | None:
    """The checkpoint id in a manifest file name (`<version>-<id>.json`), or None for other names."""
    m = _MANIFEST_NAME.match(name.rsplit("/", 1)[-1])
    return m.group(2) if m else None


def version_of_manifest(name: str) -> int | None:
    """The version a manifest file name stands for, or None for other files (temporaries)."""
    m = _MANIFEST_NAME.match(name.rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


def current_writer() -> dict[str, Any]:
    """Who wrote a manifest: host, worker pid and its JVM's pid (diagnostics only)."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "jvmPid": os.getppid()}


@dataclass(frozen=True)
class FileRef:
    path: str  # relative to the store directory; "" for a file stored inside the manifest
    size: int
    checksum: str
    data: str | None = None  # base64 of the content, for a file stored inside the manifest

    @property
    def inline(self) -> bool:
        return self.data is not None

    @staticmethod
    def inline_of(content: bytes) -> FileRef:
        return FileRef("", len(content), checksum(content), base64.b64encode(content).decode("ascii"))

    def content(self, *, store: str, version: int, name: str) -> bytes:
        """An inline file's bytes, checked against its size and checksum."""
        assert self.data is not None
        try:
            content = base64.b64decode(self.data, validate=True)
        except (binascii.Error, ValueError):
            content = b""
        if len(content) != self.size or checksum(content) != self.checksum:
            raise CheckpointDamagedError(
                f"the file {name} stored inside the manifest does not match its size and checksum",
                store=store,
                version=version,
                file=manifest_path(version),
            )
        return content

    def to_doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"size": self.size, "checksum": self.checksum}
        if self.inline:
            doc["data"] = self.data
        else:
            doc["path"] = self.path
        return doc


@dataclass(frozen=True)
class ChangesRef:
    """A changelog version's changes (a `changelog.py` segment): inline, or in a changelog file."""

    rows: int
    ref: FileRef


@dataclass
class Manifest:
    store: dict[str, Any]
    version: int
    base_version: int
    backend: str
    key_schema: str
    value_schema: str
    num_keys: int
    attempt_id: str
    shared: dict[str, FileRef] = field(default_factory=dict)
    private: dict[str, FileRef] = field(default_factory=dict)
    checkpoint_id: str | None = None
    column_families: list[str] = field(default_factory=lambda: ["default"])
    created_at: float = field(default_factory=time.time)
    writer: dict[str, Any] = field(default_factory=lambda: current_writer())
    # Identifies this commit among attempts at the same version (the last manifest written wins).
    manifest_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    key_encoding: str = KEY_ENCODING_RAW
    format: int = FORMAT_VERSION
    kind: str = KIND_SNAPSHOT
    # Of num_keys, those in Spark's internal column families (timers, TTL indexes) and our family
    # registry: Spark reports numKeys without them, as its RocksDB provider does (numInternalKeys).
    num_internal_keys: int = 0
    # changelog manifests: the attempt at `base_version` the changes apply to ("" for version 0)
    parent_manifest_id: str = ""
    changes: ChangesRef | None = None
    # How long the commit's steps took (ms: applyMs, flushMs, checkpointMs, uploadMs, restoreMs), for
    # the tools' report; diagnostics only, and left out when empty.
    commit_ms: dict[str, int] = field(default_factory=dict)

    @property
    def is_changelog(self) -> bool:
        return self.kind == KIND_CHANGELOG

    @property
    def path(self) -> str:
        """Where this manifest is published: `manifests/<version>.json`, or with checkpoint ids
        (Spark's format v2) `manifests/<version>-<id>.json`, one file per attempt."""
        return manifest_path(self.version, self.checkpoint_id)

    @property
    def parent_path(self) -> str:
        """The manifest of the attempt at `base_version` a changelog manifest's changes apply to."""
        return manifest_path(self.base_version, self.parent_manifest_id if self.checkpoint_id else None)

    @property
    def stored_bytes(self) -> int:
        """The bytes of everything this manifest names or holds inside: a snapshot's size, or a
        changelog version's changes."""
        refs = [*self.shared.values(), *self.private.values(), *([self.changes.ref] if self.changes else [])]
        return sum(r.size for r in refs)

    def files(self) -> list[FileRef]:
        """Every file of the checkpoint this manifest itself names (not those stored inside it)."""
        refs = list(self.shared.values()) + list(self.private.values())
        if self.changes is not None:
            refs.append(self.changes.ref)
        return [r for r in refs if not r.inline]

    def to_json(self) -> bytes:
        """Compact JSON: a changelog commit of a few rows writes a few hundred bytes, and the
        manifest is all it writes."""
        # Shallow (no nested dataclass is left once these three are taken out): asdict's deep copy
        # was a tenth of a small commit's time in the worker.
        doc = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("shared", "private", "changes")}
        if not self.commit_ms:
            del doc["commit_ms"]
        for kind in ("shared", "private"):
            refs: dict[str, FileRef] = getattr(self, kind)
            if refs or not self.is_changelog:
                doc[kind] = {name: ref.to_doc() for name, ref in refs.items()}
        if self.changes is not None:
            doc["changes"] = {"rows": self.changes.rows, **self.changes.ref.to_doc()}
        if self.is_changelog:
            # What a changelog manifest does not need is left out: at 200 partitions its few hundred
            # bytes are most of what a batch writes. Readers fill in the defaults; the store's
            # directory is only a diagnostic (the identity check uses operator, partition and name).
            doc = {
                k: v
                for k, v in doc.items()
                if (v not in ("", None) or k == "parent_manifest_id") and (k not in _DEFAULTS or _DEFAULTS[k] != v)
            }
            doc["store"] = {k: v for k, v in self.store.items() if k != "dir"}
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @staticmethod
    def from_json(data: bytes, *, store: str, version: int, file: str) -> Manifest:
        """Parses and validates; any problem names the store, version and manifest file."""

        def damaged(why: str) -> CheckpointDamagedError:
            return CheckpointDamagedError(f"manifest is unreadable ({why})", store=store, version=version, file=file)

        try:
            doc = json.loads(bytes(data).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise damaged(f"not valid JSON: {e}") from None
        if not isinstance(doc, dict):
            raise damaged("not a JSON object")
        fmt = doc.get("format")
        if isinstance(fmt, int) and fmt > FORMAT_VERSION:
            raise CheckpointDamagedError(
                f"the manifest has format {fmt}, written by a newer pystatestore; this release reads formats "
                f"{', '.join(map(str, READABLE_FORMATS))}",
                store=store,
                version=version,
                file=file,
                advice="Upgrade pystatestore to the release that wrote this checkpoint (or newer). Nothing was read "
                "or deleted.",
            )
        if fmt not in READABLE_FORMATS:
            raise damaged(f"format {fmt!r}; this pystatestore reads formats {READABLE_FORMATS}")

        def ref_of(r: dict[str, Any]) -> FileRef:
            if "data" in r:
                return FileRef("", int(r["size"]), str(r["checksum"]), str(r["data"]))
            return FileRef(
                validate_relative_path(r["path"], store=store, version=version), int(r["size"]), str(r["checksum"])
            )

        kind = doc.get("kind", KIND_SNAPSHOT)
        try:
            refs = {
                k: {
                    validate_file_name(name, store=store, version=version): ref_of(r)
                    for name, r in doc.get(k, {}).items()
                }
                for k in ("shared", "private")
            }
            changes = doc.get("changes")
            m = Manifest(
                store=dict(doc["store"]),
                version=int(doc["version"]),
                base_version=int(doc["base_version"]),
                backend=str(doc["backend"]),
                key_schema=str(doc.get("key_schema", "") if kind == KIND_CHANGELOG else doc["key_schema"]),
                value_schema=str(doc.get("value_schema", "") if kind == KIND_CHANGELOG else doc["value_schema"]),
                num_keys=int(doc["num_keys"]),
                num_internal_keys=int(doc.get("num_internal_keys", 0)),
                attempt_id=str(doc["attempt_id"]),
                shared=refs["shared"],
                private=refs["private"],
                checkpoint_id=doc.get("checkpoint_id"),
                column_families=list(doc.get("column_families", ["default"])),
                created_at=float(doc["created_at"]),
                writer=dict(doc.get("writer") or {}),
                manifest_id=str(doc.get("manifest_id", "")),
                key_encoding=str(doc.get("key_encoding", KEY_ENCODING_RAW)) if fmt >= 2 else KEY_ENCODING_RAW,
                format=int(fmt),
                kind=str(kind),
                parent_manifest_id=str(doc.get("parent_manifest_id", "")),
                changes=ChangesRef(int(changes["rows"]), ref_of(changes)) if changes is not None else None,
                commit_ms={str(k): int(v) for k, v in (doc.get("commit_ms") or {}).items()},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise damaged(f"missing or malformed field: {e!r}") from None
        except InvalidPathError as e:  # name the manifest that holds the bad entry
            raise InvalidPathError(e.problem, store=store, version=version, file=file) from None
        if m.version != version:
            raise damaged(f"it describes version {m.version}")
        if m.checkpoint_id is not None and (m.checkpoint_id != m.manifest_id or not is_checkpoint_id(m.checkpoint_id)):
            raise damaged(f"checkpoint id {m.checkpoint_id!r} is not its manifest id {m.manifest_id!r}")
        if m.key_encoding not in KEY_ENCODINGS:
            raise damaged(f"unknown key encoding {m.key_encoding!r}")
        if m.kind not in (KIND_SNAPSHOT, KIND_CHANGELOG):
            raise damaged(f"unknown kind {m.kind!r}")
        if m.is_changelog and (m.changes is None or m.base_version != m.version - 1):
            raise damaged("a changelog manifest without its changes or its base version")
        if m.changes is not None and not m.changes.ref.inline and not m.changes.ref.path.startswith("changelog/"):
            raise damaged(f"changes stored at {m.changes.ref.path!r}, outside changelog/")
        return m
