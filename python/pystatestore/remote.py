"""Checkpoint storage for one store directory, through pyarrow.fs.

Every path handed to this layer is relative to the store directory and validated, so nothing
outside a store's directory is ever read, written or deleted.
"""

from __future__ import annotations

import posixpath
import uuid
from dataclasses import dataclass
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.fs as pafs

from .errors import CheckpointMissingError, InvalidPathError, StoreConfigError


def validate_relative_path(rel: str, *, store: str, version: int | None = None) -> str:
    """Returns `rel` normalised, or raises if it is absolute, escapes the store or is malformed."""
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\\" in rel or "\x00" in rel:
        raise InvalidPathError(f"invalid path {rel!r} in a manifest", store=store, version=version, file=str(rel))
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts) or ":" in parts[0]:
        raise InvalidPathError(f"path {rel!r} would leave the store directory", store=store, version=version, file=rel)
    return rel


def filesystem_for(uri: str) -> tuple[pafs.FileSystem, str]:
    """Maps a Hadoop-style store location (file:/x, /x, s3a://b/x, hdfs://nn/x) to pyarrow."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        path = parsed.path if parsed.scheme else uri
        return pafs.LocalFileSystem(), posixpath.normpath(path)
    if parsed.scheme in ("s3a", "s3n"):
        uri = "s3" + uri[len(parsed.scheme) :]
    try:
        fs, path = pafs.FileSystem.from_uri(uri)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise StoreConfigError(f"checkpoint filesystem not supported by pyarrow: {e}", store=uri) from e
    return fs, path


@dataclass(frozen=True)
class RemoteFile:
    path: str  # relative to the store directory
    size: int
    mtime: float  # seconds since the epoch


class RemoteStore:
    """Files of one store under its `storeCheckpointLocation()`."""

    def __init__(self, store_uri: str) -> None:
        self.uri = store_uri
        self.fs, self.root = filesystem_for(store_uri)
        self.is_local = isinstance(self.fs, pafs.LocalFileSystem)

    def _abs(self, rel: str, version: int | None = None) -> str:
        return posixpath.join(self.root, validate_relative_path(rel, store=self.uri, version=version))

    def write_bytes(self, rel: str, data: bytes | pa.Buffer) -> None:
        """Writes a new file. Callers use unique names, so a half-written file is an orphan, never a
        replacement of a committed one."""
        path = self._abs(rel)
        self.fs.create_dir(posixpath.dirname(path), recursive=True)
        with self.fs.open_output_stream(path) as out:
            out.write(data)

    def write_atomic(self, rel: str, data: bytes) -> None:
        """Publishes a file all at once: readers see the old content or the new, never a part."""
        path = self._abs(rel)
        parent = posixpath.dirname(path)
        self.fs.create_dir(parent, recursive=True)
        if not self.is_local:  # object stores publish a PUT atomically
            with self.fs.open_output_stream(path) as out:
                out.write(data)
            return
        tmp = posixpath.join(parent, f".tmp-{uuid.uuid4().hex}")
        with self.fs.open_output_stream(tmp) as out:
            out.write(data)
        self.fs.move(tmp, path)  # rename(2): atomic replace on POSIX

    def create_parent(self, rel: str) -> None:
        self.fs.create_dir(posixpath.dirname(self._abs(rel)), recursive=True)

    def open_output(self, rel: str) -> pa.NativeFile:
        return self.fs.open_output_stream(self._abs(rel))

    def open_input(self, rel: str, *, version: int | None = None) -> pa.NativeFile:
        try:
            return self.fs.open_input_stream(self._abs(rel, version))
        except FileNotFoundError as e:
            raise CheckpointMissingError(
                "a file the checkpoint needs is missing", store=self.uri, version=version, file=rel
            ) from e

    def read_bytes(self, rel: str, *, version: int | None = None) -> pa.Buffer:
        path = self._abs(rel, version)
        try:
            with self.fs.open_input_file(path) as f:
                return f.read_buffer()
        except FileNotFoundError as e:
            raise CheckpointMissingError(
                "a file the checkpoint needs is missing", store=self.uri, version=version, file=rel
            ) from e

    def exists(self, rel: str) -> bool:
        return self.fs.get_file_info(self._abs(rel)).type != pafs.FileType.NotFound

    def list_files(self, rel_dir: str) -> list[RemoteFile]:
        """All files below `rel_dir`, recursively; empty when the directory does not exist."""
        base = self._abs(rel_dir)
        infos = self.fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
        out = []
        for info in infos:
            if info.type != pafs.FileType.File:
                continue
            rel = posixpath.relpath(info.path, self.root)
            mtime = info.mtime.timestamp() if info.mtime is not None else 0.0
            out.append(RemoteFile(rel, info.size or 0, mtime))
        return out

    def delete(self, rel: str) -> None:
        try:
            self.fs.delete_file(self._abs(rel))
        except FileNotFoundError:
            pass

    def delete_empty_dirs(self, rel_dir: str) -> None:
        """Removes empty directories below `rel_dir` (left behind by deleted version files)."""
        base = self._abs(rel_dir)
        infos = self.fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
        dirs = sorted((i.path for i in infos if i.type == pafs.FileType.Directory), key=len, reverse=True)
        for d in dirs:
            rel = posixpath.relpath(d, self.root)
            validate_relative_path(rel, store=self.uri)
            if not self.fs.get_file_info(pafs.FileSelector(d, allow_not_found=True)):
                self.fs.delete_dir(d)
