"""The changes of changelog versions kept on this host between a store's local copies
(local_recovery.py, DESIGN §5): a changelog commit keeps a local copy only every few versions, and
the segment of every version (the commit's own file, moved here once it is uploaded: nothing is
copied on one filesystem), so a restore on this host replays them from local disk.

Layout, inside the store's directory of local copies:
    <root>/v1/<store key>/changes/<version>-<manifest id>.changes   a changelog version's segment
    <root>/v1/<store key>/changes/.pystatestore-changes.json   names the store (for stale-store cleanup)

Kept changes are used only if their name gives the version and attempt and their size and checksum
match that version's manifest. What they share with the copies is here too: the store's directory
on this host and the switch that turns both off at the first failure.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import stat
from dataclasses import dataclass
from pathlib import Path

from . import local_disk
from .checksums import checksum
from .local_files import make_private_dir
from .manifest import FileRef

LAYOUT = "v1"
CHANGES_DIR = "changes"
CHANGES_SUFFIX = ".changes"
CHANGES_MARKER = ".pystatestore-changes.json"
log = logging.getLogger("pystatestore.local_recovery")


@dataclass(frozen=True)
class SaveResult:
    kept: bool
    bytes_copied: int = 0  # bytes that could not be hard-linked (another filesystem) and were copied


def version_prefix(name: str) -> int | None:
    """The version a copy's or kept segment's name starts with (`<version>-...`), or None: ASCII
    digits only, since `str.isdigit` also accepts characters `int` refuses."""
    version, sep, _ = name.partition("-")
    return int(version) if sep and version.isascii() and version.isdigit() else None


def store_key(store_dir: str) -> str:
    return hashlib.sha256(store_dir.encode()).hexdigest()[:24]


class KeptChanges:
    """The kept changes of one store on this host. LocalRecoveryStore, the store's local copies,
    extends it: both live in the store's directory here, and a failure of either turns both off."""

    def __init__(self, root: Path, store_dir: str) -> None:
        self.store_dir = store_dir
        self.root = root
        self.dir = root / LAYOUT / store_key(store_dir)
        self._disabled_reason: str | None = None

    @property
    def enabled(self) -> bool:
        return self._disabled_reason is None

    def _disable(self, why: str) -> None:
        if self._disabled_reason is None:
            log.warning(
                "local recovery copies disabled for store %s: %s; restores will come from the checkpoint",
                self.store_dir,
                why,
            )
        self._disabled_reason = why

    def save_changes(self, version: int, manifest_id: str, segment: Path, *, drop_through: int) -> SaveResult:
        """Keeps the changelog segment of `version` (the commit's own file, moved here after it was
        uploaded: nothing is copied on one filesystem) and forgets kept changes of versions up to
        `drop_through`, which no kept copy needs. Never raises."""
        if not self.enabled:
            return SaveResult(False)
        try:
            changes = self.dir / CHANGES_DIR
            for d in (self.root, self.root / LAYOUT, self.dir):
                make_private_dir(d)
            make_private_dir(changes)
            if not (changes / CHANGES_MARKER).exists():
                local_disk.DISK.write(
                    str(changes / CHANGES_MARKER), json.dumps({"store": self.store_dir}).encode(), None
                )
            target = changes / f"{version}-{manifest_id}{CHANGES_SUFFIX}"
            copied = 0
            try:  # unsynced: kept changes are read only if their size and checksum match the manifest
                local_disk.DISK.rename(str(segment), str(target))
            except OSError:  # another filesystem: copy under a temporary name, then rename
                tmp = changes / f".{target.name}.tmp"
                local_disk.DISK.copy_file(str(segment), str(tmp))
                local_disk.DISK.rename(str(tmp), str(target))
                copied = target.stat().st_size
            self._drop_changes_through(drop_through)
            return SaveResult(True, copied)
        except FileNotFoundError as e:  # pruned under us by another instance of the store (see save)
            log.info("changes of store %s version %d not kept: %s", self.store_dir, version, e)
            return SaveResult(False)
        except OSError as e:
            self._disable(f"{type(e).__name__}: {e}")
            return SaveResult(False)

    def has_changes(self, version: int, manifest_id: str, ref: FileRef) -> bool:
        """Whether the changes of this version and attempt are kept here with the size `ref` gives
        (their checksum is checked when they are read)."""
        if not self.enabled:
            return False
        try:
            st = self._changes_path(version, manifest_id).lstat()
        except OSError:
            return False
        return stat.S_ISREG(st.st_mode) and st.st_size == ref.size

    def read_changes(self, version: int, manifest_id: str, ref: FileRef) -> bytes | None:
        """The kept changes of this version and attempt if their size and CRC-32 match `ref` (the
        version's manifest), else None; a mismatch is reported and the file dropped."""
        if not self.has_changes(version, manifest_id, ref):
            return None
        path = self._changes_path(version, manifest_id)
        try:
            data = path.read_bytes()
        except OSError:
            return None  # pruned by another instance of the store since the check
        found = checksum(data)
        if len(data) == ref.size and found == ref.checksum:
            return data
        log.warning(
            "kept changes %s of store %s (version %d) do not match the manifest (checksum %s, expected %s); "
            "fetching them from the checkpoint instead",
            path,
            self.store_dir,
            version,
            found,
            ref.checksum,
        )
        _remove(path)
        return None

    def _drop_changes_through(self, version: int) -> None:
        for v, _, path in self._kept_changes():
            if v <= version:
                _remove(path)

    def _drop_changes_of_other_attempts(self, version: int, manifest_id: str) -> None:
        for v, mid, path in self._kept_changes():
            if v == version and mid != manifest_id:
                _remove(path)

    def _forget_changes_after(self, version: int) -> None:
        """Never raises (see LocalRecoveryStore.forget_later_versions)."""
        for v, _, path in self._kept_changes():
            if v > version:
                with contextlib.suppress(OSError):
                    _remove(path)

    def _changes_path(self, version: int, manifest_id: str) -> Path:
        return self.dir / CHANGES_DIR / f"{version}-{manifest_id}{CHANGES_SUFFIX}"

    def _kept_changes(self) -> list[tuple[int, str, Path]]:
        """(version, manifest id, path) of every kept segment (none if the directory is not ours)."""
        changes = self.dir / CHANGES_DIR
        try:
            for d in (self.root, self.root / LAYOUT, self.dir, changes):  # never through a link
                make_private_dir(d, create=False)
            entries = list(changes.iterdir())
        except OSError:
            return []
        out = []
        for path in entries:
            version, rest = version_prefix(path.name), path.name.partition("-")[2]
            if version is not None and rest.endswith(CHANGES_SUFFIX) and not path.is_symlink():
                out.append((version, rest[: -len(CHANGES_SUFFIX)], path))
        return out


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        local_disk.DISK.unlink(str(path))
