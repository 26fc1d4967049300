"""Checkpoint storage for one store directory, through pyarrow.fs.

Every path handed to this layer is relative to the store directory and validated, so nothing
outside a store's directory is ever read, written or deleted. On the local filesystem every path
must also resolve inside the store (no symbolic link leads out), and listings do not follow links.

Durability: a write returns once what it wrote survives a power cut. On a local or mounted
filesystem writes go through `local_disk.DISK` (data fsynced, then the directory naming it); on an
object store a completed PUT is the durability point; elsewhere (HDFS) a closed output stream.
"""

from __future__ import annotations

import errno
import os
import posixpath
import re
import stat
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import BinaryIO
from urllib.parse import urlparse

import pyarrow as pa

# pyarrow._fs, not pyarrow.fs: the latter loads the S3, GCS, Azure and HDFS modules (libarrow_s3
# alone is ~3 MiB resident in every worker). They load in filesystem_for, where a checkpoint is not
# on a local disk.
import pyarrow._fs as pafs

from . import local_disk
from .errors import CheckpointMissingError, InvalidPathError, StoreConfigError

# Logical file names (RocksDB's 000012.sst, MANIFEST-000005, CURRENT, our snapshot.arrow) are one
# plain path component: they become local file names, so nothing else may get through.
_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")
# A manifest an overwrite moved aside on filesystems whose rename cannot replace (see publish).
REPLACED_PREFIX = ".replaced-"


def validate_relative_path(rel: str, *, store: str, version: int | None = None) -> str:
    """Returns `rel`, or raises if it is absolute, escapes the store or is malformed."""
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\\" in rel or "\x00" in rel:
        raise InvalidPathError(f"invalid path {rel!r} in a manifest", store=store, version=version, file=str(rel))
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts) or ":" in parts[0]:
        raise InvalidPathError(f"path {rel!r} would leave the store directory", store=store, version=version, file=rel)
    return rel


def validate_file_name(name: str, *, store: str, version: int | None = None) -> str:
    """Returns `name` if it is a plain file name (letters, digits, '.', '_', '-'; not '.' or '..')."""
    if not isinstance(name, str) or not _FILE_NAME.match(name) or name in (".", ".."):
        raise InvalidPathError(
            f"file name {name!r} is not a plain file name and could leave the local directory",
            store=store,
            version=version,
            file=str(name),
        )
    return name


def local_file_in(directory: str | os.PathLike[str], name: str, *, store: str, version: int | None = None) -> str:
    """`directory/name` after checking that `name` cannot point anywhere else."""
    validate_file_name(name, store=store, version=version)
    return os.path.join(os.fspath(directory), name)


def durability_point(rel: str, what: str) -> str:
    """The name of the fsync that makes `what` ("data" or "name") of store file `rel` durable:
    its kind (`manifests`, `changelog`, `shared`, `private`, `snapshots`, `leases`) and `what`."""
    return f"{rel.split('/', 1)[0] if '/' in rel else 'store'}:{what}"


def checkpoint_root_of(store_path: str) -> str:
    """The checkpoint directory a store directory lies in by Spark's layout
    (`<checkpoint>/state/<operator>/<partition>[/<store name>]`), or the store directory itself
    when it is laid out otherwise (a test's, a tool's)."""
    parts = posixpath.normpath(store_path).split("/")
    for depth in (3, 4):  # the default store, a named one (a join's four)
        if len(parts) <= depth:
            continue
        state, operator, partition = parts[-depth], parts[1 - depth], parts[2 - depth]
        if state == "state" and operator.isdigit() and partition.isdigit():
            return "/".join(parts[:-depth]) or "/"
    return posixpath.normpath(store_path)


def join_uri(uri: str, *parts: str) -> str:
    """`uri` with path segments appended, keeping a query string (pyarrow's S3 options such as
    `?endpoint_override=host:9000&scheme=http`) at the end, where pyarrow reads it."""
    base, sep, query = uri.partition("?")
    return base.rstrip("/") + "/" + "/".join(parts) + sep + query


def filesystem_for(uri: str) -> tuple[pafs.FileSystem, str]:
    """Maps a Hadoop-style store location (file:/x, /x, s3a://b/x, hdfs://nn/x) to pyarrow."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        path = parsed.path if parsed.scheme else uri
        return pafs.LocalFileSystem(), posixpath.normpath(path)
    if parsed.scheme in ("s3a", "s3n"):
        uri = "s3" + uri[len(parsed.scheme) :]
    if urlparse(uri).scheme == "s3" and "allow_delayed_open" not in parsed.query:
        # A small object (a manifest, a lease, a changelog segment) then goes up in one PUT rather
        # than a multipart upload of three requests.
        uri += ("&" if parsed.query else "?") + "allow_delayed_open=true"
    import pyarrow.fs  # the object-store modules, and S3's shutdown hook, only where they are used

    try:
        fs, path = pyarrow.fs.FileSystem.from_uri(uri)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise StoreConfigError(f"checkpoint filesystem not supported by pyarrow: {e}", store=uri) from e
    return fs, path


def is_object_store(fs: pafs.FileSystem) -> bool:
    """Object stores publish a single PUT atomically but have no atomic rename."""
    return fs.type_name in _OBJECT_STORE_TYPES


_OBJECT_STORE_TYPES = frozenset({"s3", "gcs", "abfs"})  # FileSystem.type_name of S3, GCS, Azure


@dataclass(frozen=True)
class RemoteFile:
    path: str  # relative to the store directory
    size: int
    mtime: float | None  # seconds since the epoch; None where the filesystem gives none (object-store directories)


class RemoteStore:
    """Files of one store under its `storeCheckpointLocation()`."""

    def __init__(self, store_uri: str, fs: pafs.FileSystem | None = None, root: str | None = None) -> None:
        self.uri = store_uri
        if fs is None:
            self.fs, self.root = filesystem_for(store_uri)
        else:  # tests hand in other filesystems (e.g. one whose rename cannot replace, like HDFS)
            self.fs, self.root = fs, root if root is not None else store_uri
        self.is_local = isinstance(self.fs, pafs.LocalFileSystem)
        self._real_root: str | None = None  # resolved on first use: the store may not exist yet
        self.object_store = is_object_store(self.fs)
        # On a local disk, the directories from here down to the store are made durable along with
        # the store's own (`LocalDisk.make_dirs`): the checkpoint's, where Spark's layout shows it.
        self.durable_root = checkpoint_root_of(self.root) if self.is_local else self.root

    def _abs(self, rel: str, version: int | None = None) -> str:
        """The absolute path of store-relative `rel`. On the local filesystem it must also resolve
        inside the store: a symbolic link planted in a store (a directory or a file) could otherwise
        make a read, write or delete reach outside it."""
        checked = validate_relative_path(rel, store=self.uri, version=version)
        path = posixpath.join(self.root, checked)
        if self.is_local and not self._resolves_inside(checked):
            raise InvalidPathError(
                f"{rel!r} resolves outside the store directory (a symbolic link?); nothing was read or written",
                store=self.uri,
                version=version,
                file=rel,
            )
        return path

    def _resolves_inside(self, rel: str) -> bool:
        """Whether the validated relative path `rel` resolves inside the store. Every call of every
        commit and GC run comes here, so the store root is resolved once and only the components
        below it are checked (one lstat each); a symbolic link among them is resolved in full."""
        if self._real_root is None:
            self._real_root = os.path.realpath(self.root)
        path = self._real_root
        for part in rel.split("/"):
            if not part:
                continue
            path = os.path.join(path, part)
            try:
                mode = os.lstat(path).st_mode
            except (FileNotFoundError, NotADirectoryError):
                return True  # nothing below exists to lead elsewhere; a write creates real entries
            except OSError:
                break  # unreadable: let the full resolution decide
            if stat.S_ISLNK(mode):
                break
        else:
            return True
        real = os.path.realpath(os.path.join(self._real_root, rel))
        return real == self._real_root or real.startswith(self._real_root + os.sep)

    def write_bytes(self, rel: str, data: bytes | pa.Buffer) -> None:
        """Writes a file, durably. Callers use unique names (or, for leases, their own name), so a
        half-written file is an orphan, never a replacement of a committed one."""
        path = self._abs(rel)
        self._create_parent_dir(path)
        if self.is_local:
            local_disk.DISK.write(path, memoryview(data), durability_point(rel, "data"))
            local_disk.DISK.sync_dir(posixpath.dirname(path), durability_point(rel, "name"))
            return
        with self.fs.open_output_stream(path) as out:
            out.write(data)

    def _create_parent_dir(self, path: str) -> None:
        """Object stores have no directories: creating one would only write marker objects, a PUT
        per level of the path on every write."""
        if self.is_local:
            local_disk.DISK.make_dirs(posixpath.dirname(path), "directory:name", root=self.durable_root)
        elif not self.object_store:
            self.fs.create_dir(posixpath.dirname(path), recursive=True)

    def publish(self, rel: str, data: bytes, *, durable: bool = True) -> None:
        """Publishes a file all at once, durably: readers see the old content or the new, never a part.

        Object stores: one PUT. Local disks: a temporary file written and fsynced, renamed over the
        final name, the directory fsynced (not `durable`: neither fsync, for a file nothing needs
        after a power cut, such as a lease, which a power cut makes moot by ending its attempt).
        Elsewhere a temporary renamed over the final name; where rename cannot replace an existing
        file (HDFS), the old file is first renamed aside (`.replaced-<name>-<uuid>`) and the new one
        renamed in; a reader that finds no final file takes the newest file set aside, so a crash
        between the two renames loses nothing.
        """
        path = self._abs(rel)
        parent = posixpath.dirname(path)
        self._create_parent_dir(path)
        if self.object_store:
            with self.fs.open_output_stream(path) as out:
                out.write(data)
            return
        name = posixpath.basename(path)
        tmp = posixpath.join(parent, f".tmp-{name}-{uuid.uuid4().hex}")
        if self.is_local:
            local_disk.DISK.write(tmp, data, durability_point(rel, "data") if durable else None)
            try:
                if durable:
                    local_disk.DISK.replace(tmp, path, durability_point(rel, "name"))
                else:
                    local_disk.DISK.rename(tmp, path)
            except OSError:
                self._delete_quietly(tmp)
                raise
            return
        with self.fs.open_output_stream(tmp) as out:
            out.write(data)
        try:
            self.fs.move(tmp, path)  # rename(2) on POSIX: an atomic replace
            return
        except OSError:
            if self.fs.get_file_info(path).type == pafs.FileType.NotFound:
                self._delete_quietly(tmp)
                raise
        aside = posixpath.join(parent, f"{REPLACED_PREFIX}{name}-{uuid.uuid4().hex}")
        self.fs.move(path, aside)
        self.fs.move(tmp, path)

    def replaced_versions_of(self, rel: str) -> list[str]:
        """Store-relative paths of the files `publish` moved aside from `rel` (in no useful order)."""
        parent, name = posixpath.split(rel)
        prefix = f"{REPLACED_PREFIX}{name}-"
        return [f.path for f in self.list_files(parent) if posixpath.basename(f.path).startswith(prefix)]

    def create_parent(self, rel: str) -> None:
        self._create_parent_dir(self._abs(rel))

    def open_output(self, rel: str) -> BinaryIO | pa.NativeFile:
        """A new file to stream into; `finish_output` before closing it, then `sync_names`."""
        path = self._abs(rel)
        if self.is_local:
            return local_disk.DISK.open_new(path)
        return self.fs.open_output_stream(path)

    def finish_output(self, out: BinaryIO | pa.NativeFile, rel: str) -> None:
        """Makes the data streamed into `out` (from `open_output(rel)`) durable before it closes."""
        if self.is_local:
            local_disk.DISK.sync_file(out, durability_point(rel, "data"))  # type: ignore[arg-type]

    def sync_removals(self, rels: Iterable[str]) -> None:
        """Makes the removal of `rels` durable (local disks: their directories fsynced, each once)."""
        if self.is_local:
            for directory in sorted({posixpath.dirname(self._abs(rel)) for rel in rels}):
                local_disk.DISK.sync_dir(directory, "removals:name")

    def sync_names(self, rels: Iterable[str]) -> None:
        """Makes the names of files written through `open_output` durable: their directories,
        each once, are fsynced (local disks; elsewhere a closed stream is already final)."""
        if not self.is_local:
            return
        dirs: dict[str, str] = {}
        for rel in rels:
            dirs.setdefault(posixpath.dirname(self._abs(rel)), durability_point(rel, "name"))
        for directory, point in dirs.items():
            local_disk.DISK.sync_dir(directory, point)

    def local_path(self, rel: str, *, version: int | None = None) -> str | None:
        """The absolute path of `rel` when the store is on a local or mounted filesystem (checked
        to resolve inside the store), so a restore may hard-link it; None elsewhere."""
        return self._abs(rel, version) if self.is_local else None

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
        """All files below `rel_dir`, recursively; empty when the directory does not exist. On the
        local filesystem symbolic links are neither listed nor followed."""
        base = self._abs(rel_dir)
        if self.is_local:
            return self._list_local(base)
        infos = self.fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
        out = []
        for info in infos:
            if info.type != pafs.FileType.File:
                continue
            rel = posixpath.relpath(info.path, self.root)
            mtime = info.mtime.timestamp() if info.mtime is not None else None
            out.append(RemoteFile(rel, info.size or 0, mtime))
        return out

    def _list_local(self, base: str) -> list[RemoteFile]:
        out: list[RemoteFile] = []
        stack = [base]
        while stack:
            d = stack.pop()
            try:
                entries = list(os.scandir(d))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for e in entries:
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                elif e.is_file(follow_symlinks=False):
                    try:
                        st = e.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # deleted since the directory was read (GC in another process)
                    out.append(RemoteFile(posixpath.relpath(e.path, self.root), st.st_size, st.st_mtime))
        return out

    def list_dirs(self, rel_dir: str) -> list[RemoteFile]:
        """The directories directly below `rel_dir` (size 0), with their modification times."""
        base = self._abs(rel_dir)
        infos = self.fs.get_file_info(pafs.FileSelector(base, recursive=False, allow_not_found=True))
        out = []
        for info in infos:
            if info.type != pafs.FileType.Directory:
                continue
            if self.is_local and os.path.islink(info.path):
                continue
            mtime = info.mtime.timestamp() if info.mtime is not None else None
            out.append(RemoteFile(posixpath.relpath(info.path, self.root), 0, mtime))
        return out

    def delete(self, rel: str) -> None:
        path = self._abs(rel)
        if self.is_local and os.path.islink(path):
            raise InvalidPathError(
                f"refusing to delete {rel!r}: it is a symbolic link, which no store writes", store=self.uri, file=rel
            )
        self._delete_quietly(path)

    def _delete_quietly(self, path: str) -> None:
        try:
            if self.is_local:
                local_disk.DISK.unlink(path)
            else:
                self.fs.delete_file(path)
        except FileNotFoundError:
            pass

    def remove_dir_if_empty(self, rel_dir: str) -> bool:
        """Removes an empty directory. On the local filesystem this is rmdir(2), which refuses a
        directory that is not empty, so a file written meanwhile is never lost. Elsewhere the caller
        must know that nobody writes there any more (see retention: only directories of attempts
        that hold no lease and are older than the grace period)."""
        path = self._abs(rel_dir)
        if self.is_local:
            if os.path.islink(path):
                return False
            try:
                local_disk.DISK.rmdir(path)
                return True
            except OSError as e:
                if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT, errno.ENOTDIR):
                    return False
                raise
        if self.fs.get_file_info(pafs.FileSelector(path, allow_not_found=True)):
            return False
        self.fs.delete_dir(path)
        return True


def describe_foreign_layout(remote: RemoteStore) -> str | None:
    """If the store directory holds another provider's files, says which; else None."""
    try:
        infos = remote.fs.get_file_info(pafs.FileSelector(remote.root, allow_not_found=True))
    except OSError:
        return None
    names = sorted(posixpath.basename(i.path) for i in infos)
    spark_hdfs = [n for n in names if re.fullmatch(r"\d+\.(delta|snapshot)", n)]
    spark_rocksdb = [n for n in names if re.fullmatch(r"\d+(_[0-9a-f-]+)?\.(zip|changelog)", n) or n == "SSTs"]
    if spark_rocksdb:
        return f"Spark's RocksDBStateStoreProvider (found {', '.join(spark_rocksdb[:3])})"
    if spark_hdfs:
        return f"Spark's HDFSBackedStateStoreProvider (found {', '.join(spark_hdfs[:3])})"
    return None
