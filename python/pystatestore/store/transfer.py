"""Parallel, checksummed file transfers between a local directory and checkpoint storage."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa

from . import local_disk
from .checksums import checksum_text, crc32
from .errors import CheckpointDamagedError, CheckpointMissingError
from .manifest import FileRef
from .remote import RemoteStore, local_file_in

# Each transfer copies through one reused buffer of this size: with a few transfers in flight per
# worker (and glibc keeping freed chunks of this size in its arenas), the buffer is most of what a
# transfer costs in resident memory. 4 MiB chunks, freshly allocated, cost the worker 36 MiB at the
# peak of a 4-thread restore; 1 MiB reused ones 8 MiB, at the same speed on a local disk. Keep it
# below S3's 5 MiB part size: Arrow's object-store streams copy smaller writes into their part
# buffer, but may upload a larger one straight from the caller's (here reused) memory.
CHUNK = 1 << 20
# Called with ("upload:file" | "download:file", 0) after each file and ("upload:chunk" |
# "download:chunk", bytes of the chunk) after each chunk: tests raise from it to crash mid-transfer
# (a chunk fault leaves a partial file), and `pystatestore read` counts the bytes for its bars.
TransferHook = Callable[[str, int], None]


@dataclass(frozen=True)
class TransferStats:
    files: int
    bytes: int


def upload_file(remote: RemoteStore, local: Path, rel: str, *, hook: TransferHook | None = None) -> FileRef:
    """Copies one local file to `rel`, computing its checksum on the way; durable on return."""
    ref = _upload(remote, local, rel, hook)
    remote.sync_names([rel])
    return ref


def _upload(remote: RemoteStore, local: Path, rel: str, hook: TransferHook | None) -> FileRef:
    """The copy of `upload_file`, its data durable, its name not yet (`RemoteStore.sync_names`)."""
    remote.create_parent(rel)
    with open(local, "rb") as src, remote.open_output(rel) as out:
        crc, size = _copy(src, out, hook, "upload:chunk")
        remote.finish_output(out, rel)
    return FileRef(rel, size, checksum_text(crc))


def _copy(
    src: BinaryIO | pa.NativeFile, out: BinaryIO | pa.NativeFile | None, hook: TransferHook | None, point: str
) -> tuple[int, int]:
    """Copies `src` to `out` (None: only reads it) through one buffer; returns (crc32, bytes)."""
    buffer = memoryview(bytearray(CHUNK))
    crc, size = 0, 0
    while n := src.readinto(buffer):
        chunk = buffer[:n]
        crc = crc32(chunk, crc)
        size += n
        if out is not None:
            out.write(chunk)
        if hook is not None:
            hook(point, n)
    return crc, size


def download_file(
    remote: RemoteStore,
    ref: FileRef,
    local_dir: Path,
    name: str,
    *,
    version: int | None,
    hook: TransferHook | None = None,
    link: bool = False,
) -> int:
    """Copies `ref` to `local_dir/name` and verifies size and checksum; a mismatch names store, version
    and file. The bytes land in a temporary file first, so a failure leaves nothing under `name` and
    deletes only what this call wrote. `link`: the file is never written in place (an SST), so on a
    checkpoint on the same local filesystem it is hard-linked instead of copied, and only read once,
    for its checksum."""
    final = local_file_in(local_dir, name, store=remote.uri, version=version)
    tmp = os.path.join(local_dir, f".download-{uuid.uuid4().hex}")
    try:
        if not (link and _linked(remote, ref, tmp, version)):
            with remote.open_input(ref.path, version=version) as src, open(tmp, "xb") as out:
                crc, size = _copy(src, out, hook, "download:chunk")
        else:
            with open(tmp, "rb") as linked:
                crc, size = _copy(linked, None, hook, "download:chunk")
        if size != ref.size or checksum_text(crc) != ref.checksum:
            raise CheckpointDamagedError(
                f"downloaded {size} bytes with {checksum_text(crc)}, "
                f"the manifest says {ref.size} bytes with {ref.checksum}",
                store=remote.uri,
                version=version,
                file=ref.path,
            )
        os.replace(tmp, final)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return size


def _linked(remote: RemoteStore, ref: FileRef, tmp: str, version: int | None) -> bool:
    """Hard-links checkpoint file `ref` at `tmp`; False when it cannot (another filesystem, an object
    store, links not allowed): the caller copies it."""
    source = remote.local_path(ref.path, version=version)
    if source is None:
        return False
    try:
        local_disk.DISK.link(source, tmp)
    except FileNotFoundError as e:
        raise CheckpointMissingError(
            "a file the checkpoint needs is missing", store=remote.uri, version=version, file=ref.path
        ) from e
    except OSError:
        return False
    return True


def upload_all(
    remote: RemoteStore, items: list[tuple[Path, str]], threads: int, *, hook: TransferHook | None = None
) -> list[FileRef]:
    """Uploads each (local file, store path) in parallel; every file durable on return."""
    if not items:
        return []

    def one(item: tuple[Path, str]) -> FileRef:
        ref = _upload(remote, item[0], item[1], hook)
        if hook is not None:
            hook("upload:file", 0)
        return ref

    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(items)))) as pool:
        refs = list(pool.map(one, items))
    remote.sync_names(rel for _, rel in items)  # each directory once, after all its files
    return refs


def download_all(
    remote: RemoteStore,
    items: list[tuple[FileRef, str]],
    local_dir: Path,
    threads: int,
    *,
    version: int,
    hook: TransferHook | None = None,
    link: Callable[[str], bool] = lambda name: False,
) -> TransferStats:
    """Downloads each (ref, logical name) into `local_dir`; a name `link` accepts may be hard-linked
    (`download_file`)."""
    if not items:
        return TransferStats(0, 0)

    def one(item: tuple[FileRef, str]) -> int:
        size = download_file(remote, item[0], local_dir, item[1], version=version, hook=hook, link=link(item[1]))
        if hook is not None:
            hook("download:file", 0)
        return size

    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(items)))) as pool:
        sizes = list(pool.map(one, items))
    return TransferStats(len(sizes), sum(sizes))
