"""Owner-only directories and files on local disk: what local recovery copies are made of.

Local copies live outside Spark's per-application directories, on a host other users may share,
so every directory is checked to be a real one of this user's before anything is put in or taken
from it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from . import local_disk


def link_or_copy_tree(src: Path, dst: Path) -> int:
    """Recreates the files of `src` in the new directory `dst` as hard links; files that cannot be
    linked (another filesystem) are copied. Returns the bytes copied. Not synced: a copy is only
    used once every file matches the size and checksum its marker lists."""
    local_disk.DISK.mkdir(str(dst), 0o700)
    copied = 0
    for entry in os.scandir(src):
        if not entry.is_file(follow_symlinks=False):
            continue
        target = str(dst / entry.name)
        try:
            local_disk.DISK.link(entry.path, target)
        except OSError:
            local_disk.DISK.copy_file(entry.path, target)
            copied += entry.stat(follow_symlinks=False).st_size
    return copied


class UnsafeDirectoryError(OSError):
    """A local-recovery directory that another user could tamper with."""


def make_private_dir(path: Path, *, create: bool = True) -> None:
    """Creates `path` (and missing parents) owner-only, or checks that an existing one is a real
    directory owned by this user, tightening its mode if it is ours. Raises UnsafeDirectoryError
    when it is a symbolic link or belongs to someone else (FileNotFoundError when it is missing and
    `create` is false)."""
    if create:
        missing = []
        p = path
        while not os.path.lexists(p):
            missing.append(p)
            p = p.parent
        for d in reversed(missing):
            try:
                local_disk.DISK.mkdir(str(d), 0o700)
            except FileExistsError:
                pass
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectoryError(f"{path} is not a plain directory (a symbolic link or a file)")
    if st.st_uid != os.getuid():
        raise UnsafeDirectoryError(f"{path} belongs to uid {st.st_uid}, not to this user (uid {os.getuid()})")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
