"""Manifests: a version's commit point (DESIGN §3), written last and atomically.

A manifest lists every file the version needs with its size and checksum. Reading one validates
its structure, every path in it and every logical file name (which becomes a local file name)
before anything else trusts it.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
import uuid
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any

from .errors import CheckpointDamagedError, InvalidPathError
from .remote import validate_file_name, validate_relative_path

# Format 2 records how keys are stored (`key_encoding`); format 1 (releases before 0.3.0) always
# stored Spark's key bytes as they are ("raw").
FORMAT_VERSION = 2
READABLE_FORMATS = (1, 2)
MANIFEST_DIR = "manifests"
KEY_ENCODING_RAW = "raw"
# A prefix-scan store's keys: 4-byte big-endian length of the prefix row, the prefix row's bytes,
# then the whole key row's bytes, so a prefix scan is a seek over a byte prefix (DESIGN §2).
KEY_ENCODING_PREFIX = "prefix-v1"
KEY_ENCODINGS = (KEY_ENCODING_RAW, KEY_ENCODING_PREFIX)
_MANIFEST_NAME = re.compile(r"^(\d+)(?:-([0-9A-Za-z_.-]+))?\.json$")


def checksum(data: bytes | memoryview | Any) -> str:
    """CRC-32 of a bytes-like object (pyarrow Buffers included), as stored in manifests."""
    return f"crc32:{zlib.crc32(data) & 0xFFFFFFFF:08x}"


def manifest_path(version: int, checkpoint_id: str | None = None) -> str:
    return (
        f"{MANIFEST_DIR}/{version}.json" if checkpoint_id is None else f"{MANIFEST_DIR}/{version}-{checkpoint_id}.json"
    )


def version_of_manifest(name: str) -> int | None:
    """The version a manifest file name stands for, or None for other files (temporaries)."""
    m = _MANIFEST_NAME.match(name.rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


def current_writer() -> dict[str, Any]:
    """Who wrote a manifest: host, worker pid and its JVM's pid (diagnostics only)."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "jvmPid": os.getppid()}


@dataclass(frozen=True)
class FileRef:
    path: str  # relative to the store directory
    size: int
    checksum: str


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

    def files(self) -> list[FileRef]:
        return list(self.shared.values()) + list(self.private.values())

    def to_json(self) -> bytes:
        doc = asdict(self)
        return json.dumps(doc, sort_keys=True, indent=1).encode()

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
        try:
            refs = {
                kind: {
                    validate_file_name(name, store=store, version=version): FileRef(
                        validate_relative_path(r["path"], store=store, version=version),
                        int(r["size"]),
                        str(r["checksum"]),
                    )
                    for name, r in doc[kind].items()
                }
                for kind in ("shared", "private")
            }
            m = Manifest(
                store=dict(doc["store"]),
                version=int(doc["version"]),
                base_version=int(doc["base_version"]),
                backend=str(doc["backend"]),
                key_schema=str(doc["key_schema"]),
                value_schema=str(doc["value_schema"]),
                num_keys=int(doc["num_keys"]),
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
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise damaged(f"missing or malformed field: {e!r}") from None
        except InvalidPathError as e:  # name the manifest that holds the bad entry
            raise InvalidPathError(e.problem, store=store, version=version, file=file) from None
        if m.version != version:
            raise damaged(f"it describes version {m.version}")
        if m.key_encoding not in KEY_ENCODINGS:
            raise damaged(f"unknown key encoding {m.key_encoding!r}")
        return m
