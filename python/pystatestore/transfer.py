"""Parallel, checksummed file transfers between a local directory and checkpoint storage."""

from __future__ import annotations

import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .errors import CheckpointDamagedError
from .manifest import FileRef
from .remote import RemoteStore

CHUNK = 4 << 20


@dataclass(frozen=True)
class TransferStats:
    files: int
    bytes: int


def _crc_text(crc: int) -> str:
    return f"crc32:{crc & 0xFFFFFFFF:08x}"


def upload_file(remote: RemoteStore, local: Path, rel: str) -> FileRef:
    """Copies one local file to `rel`, computing its checksum on the way."""
    crc, size = 0, 0
    remote.create_parent(rel)
    with open(local, "rb") as src, remote.open_output(rel) as out:
        while chunk := src.read(CHUNK):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
            out.write(chunk)
    return FileRef(rel, size, _crc_text(crc))


def download_file(remote: RemoteStore, ref: FileRef, local: Path, *, version: int | None) -> int:
    """Copies `ref` to `local` and verifies size and checksum; a mismatch names store, version, file."""
    crc, size = 0, 0
    with remote.open_input(ref.path, version=version) as src, open(local, "wb") as out:
        while chunk := src.read(CHUNK):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
            out.write(chunk)
    if size != ref.size or _crc_text(crc) != ref.checksum:
        os.remove(local)
        raise CheckpointDamagedError(
            f"downloaded {size} bytes with {_crc_text(crc)}, the manifest says {ref.size} bytes with {ref.checksum}",
            store=remote.uri,
            version=version,
            file=ref.path,
        )
    return size


def upload_all(remote: RemoteStore, items: list[tuple[Path, str]], threads: int) -> list[FileRef]:
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(items)))) as pool:
        return list(pool.map(lambda item: upload_file(remote, item[0], item[1]), items))


def download_all(
    remote: RemoteStore, items: list[tuple[FileRef, Path]], threads: int, *, version: int
) -> TransferStats:
    if not items:
        return TransferStats(0, 0)
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(items)))) as pool:
        sizes = list(pool.map(lambda item: download_file(remote, item[0], item[1], version=version), items))
    return TransferStats(len(sizes), sum(sizes))
