"""Local recovery copies (Flink's TaskLocalStateStore; DESIGN §5).

After a commit, the version's RocksDB checkpoint is kept in a directory that outlives the executor,
on the same host: its files are hard links of the commit's checkpoint (nearly free), which is why
the default directory lies on the same filesystem as the local databases; where it cannot (another
filesystem was configured), the files are copied, and that is reported. A restore then takes each file the
manifest lists from a local copy when its size and checksum match, and downloads only what is
missing or damaged. Writing a copy never fails a commit: problems are logged once per store and
the store carries on without local copies.

Changelog commits keep a copy only every few versions; the changes of the versions in between are
kept too (kept_changes.py: the commit's own segment file, moved here once it is uploaded), so a
restore on this host replays them from local disk and reads nothing from the checkpoint but manifests.

Layout (everything this module ever deletes lies inside it; every directory is owner-only):
    <root>/v1/<store key>/<version>-<manifest id>/   files of that version's checkpoint
    <root>/v1/<store key>/<version>-<manifest id>/.pystatestore-copy.json   written last
    <root>/v1/<store key>/changes/<version>-<manifest id>.changes   a changelog version's segment
    <root>/v1/<store key>/changes/.pystatestore-changes.json   names the store (for stale-store cleanup)

A copy is trusted only if its marker names this store, its version and its manifest id, and each
file is used only if its size and checksum match the manifest being restored; a segment only if
its name gives the version and attempt and its size and checksum match that version's manifest.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import local_disk
from .checksums import file_checksum
from .errors import InvalidPathError
from .kept_changes import (
    CHANGES_DIR,
    CHANGES_MARKER,
    LAYOUT,
    KeptChanges,
    SaveResult,
    store_key,
    version_prefix,
)
from .local_files import link_or_copy_tree, make_private_dir
from .manifest import FileRef
from .remote import local_file_in

MARKER = ".pystatestore-copy.json"
DEFAULT_VERSIONS_KEPT = 2
log = logging.getLogger("pystatestore.local_recovery")


def default_root(host_dir: str = "") -> Path:
    """Beside the JVM's work directories (spark.local.dir, else java.io.tmpdir: `host_dir`), so
    copies are hard links of the local databases' files; outside Spark's per-application and
    per-JVM directories, so a restarted executor on this host finds it; one per user, since the
    directory is owner-only."""
    return Path(host_dir or tempfile.gettempdir()) / f"pystatestore-local-recovery-{os.getuid()}"


@dataclass(frozen=True)
class LocalCopy:
    version: int
    manifest_id: str
    path: Path


class LocalRecoveryStore(KeptChanges):
    """The local copies of one store on this host, and the changes kept between them (KeptChanges)."""

    def __init__(
        self,
        root: Path,
        store_dir: str,
        versions_kept: int = DEFAULT_VERSIONS_KEPT,
        hook: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(root, store_dir)
        self.versions_kept = max(1, versions_kept)
        self.hook = hook  # tests raise from it to crash between moving a copy and marking it
        self._copy_reported = False

    def save(
        self, version: int, manifest_id: str, checkpoint_dir: Path, known: dict[str, FileRef] | None = None
    ) -> SaveResult:
        """Keeps the files of `checkpoint_dir` (hard links; it stays where it is) as the local copy
        of `version`. Its marker lists every file's size and checksum, so the copy can be verified
        as a whole even when the manifest lists no files (changelog versions): `known` gives those
        the caller has, files hard-linked from the previous copy keep theirs, and only the others
        are read. Never raises."""
        if not self.enabled:
            return SaveResult(False)
        try:
            make_private_dir(self.root)
            make_private_dir(self.root / LAYOUT)
            make_private_dir(self.dir)
            previous = self.copies()
            target = self.dir / f"{version}-{manifest_id}"
            copied = link_or_copy_tree(checkpoint_dir, target)
            files = self._file_list(target, known or {}, previous[0].path if previous else None)
            if copied and not self._copy_reported:
                self._copy_reported = True
                log.warning(
                    "local recovery copies of store %s are copied, not hard-linked (%d bytes this time): %s is "
                    "on another filesystem than the local databases (%s). Every commit copies the whole "
                    "state; set spark.sql.streaming.stateStore.pystatestore.localRecoveryDir to a directory "
                    "on the same filesystem as spark.local.dir, or leave it unset.",
                    self.store_dir,
                    copied,
                    self.root,
                    checkpoint_dir.parent,
                )
            if self.hook is not None:
                self.hook("local-save:moved")
            marker = {
                "store": self.store_dir,
                "version": version,
                "manifestId": manifest_id,
                "savedAt": time.time(),
                "files": files,
            }
            # Unsynced: a restore uses a copy only once every file matches this marker, which a
            # power cut that lost or tore any of them (or the marker) does not.
            local_disk.DISK.write(str(target / MARKER), json.dumps(marker).encode(), None)
            # The copies listed before this one plus this one: no second scan of every marker.
            complete = [LocalCopy(version, manifest_id, target), *previous]
            self.prune(keep_newest=self.versions_kept, complete=complete)
            # A restore replays only changes after a kept copy: older kept changes are of no use.
            oldest_kept = sorted(c.version for c in complete)[-self.versions_kept :][0]
            self._drop_changes_through(oldest_kept)
            return SaveResult(True, copied)
        except FileNotFoundError as e:
            # Every directory was made above, so something removed what this save was writing:
            # another instance of the store on this host (a retried or speculative task) pruned
            # it, a race that passes. This version goes without a copy; later ones get theirs.
            log.info("local copy of store %s version %d not kept: %s", self.store_dir, version, e)
            return SaveResult(False)
        except OSError as e:
            self._disable(f"{type(e).__name__}: {e}")
            return SaveResult(False)

    @staticmethod
    def _file_list(copy: Path, known: dict[str, FileRef], previous: Path | None) -> dict[str, list[Any]]:
        """name -> [size, checksum] for every file of `copy`."""
        before: dict[str, list[Any]] = {}
        if previous is not None:
            try:
                before = json.loads((previous / MARKER).read_text()).get("files") or {}
            except (OSError, ValueError, AttributeError):
                before = {}
        out: dict[str, list[Any]] = {}
        for f in copy.iterdir():
            if f.name == MARKER or not f.is_file() or f.is_symlink():
                continue
            st = f.stat()
            ref = known.get(f.name)
            if ref is not None and ref.size == st.st_size:
                out[f.name] = [ref.size, ref.checksum]
                continue
            prior = before.get(f.name)
            if prior is not None and prior[0] == st.st_size and previous is not None:
                try:
                    if (previous / f.name).stat().st_ino == st.st_ino:  # the same file, hard-linked
                        out[f.name] = list(prior)
                        continue
                except OSError:
                    pass
            out[f.name] = list(file_checksum(f))
        return out

    def verified_copy(self, version: int, manifest_id: str) -> dict[str, Path] | None:
        """The files of the local copy of exactly this version and attempt, if each one matches the
        size and checksum its marker lists (a copy saved before markers listed files is not used
        this way). A mismatch is reported and the copy not used."""
        for copy in self.copies():
            if copy.version != version or copy.manifest_id != manifest_id:
                continue
            try:
                listed = json.loads((copy.path / MARKER).read_text()).get("files")
            except (OSError, ValueError, AttributeError):
                return None
            if not isinstance(listed, dict) or not listed:
                return None
            out: dict[str, Path] = {}
            for name, (size, expected) in listed.items():
                try:
                    path = Path(local_file_in(copy.path, name, store=self.store_dir, version=version))
                    st = path.lstat()
                    ok = stat.S_ISREG(st.st_mode) and st.st_size == size and file_checksum(path) == (size, expected)
                except (OSError, InvalidPathError, ValueError, TypeError):
                    ok = False
                if not ok:
                    log.warning(
                        "local recovery copy %s of store %s (version %d) is damaged at %s; not using it",
                        copy.path,
                        self.store_dir,
                        version,
                        name,
                    )
                    return None
                out[name] = path
            return out
        return None

    def copies(self) -> list[LocalCopy]:
        """Complete copies, newest first. Incomplete ones (no marker) and copies whose marker does
        not describe them (another store, version or attempt) are ignored."""
        if not self.enabled:
            return []
        try:
            for d in (self.root, self.root / LAYOUT, self.dir):
                make_private_dir(d, create=False)
        except FileNotFoundError:
            return []
        except OSError as e:
            self._disable(f"{type(e).__name__}: {e}")
            return []
        found = []
        for d in self.dir.iterdir():
            version = version_prefix(d.name)
            if version is not None and d.is_dir() and not d.is_symlink() and self._marker_matches(d, version):
                found.append(LocalCopy(version, d.name.partition("-")[2], d))
        return sorted(found, key=lambda c: c.version, reverse=True)

    def _marker_matches(self, copy_dir: Path, version: int) -> bool:
        try:
            marker = json.loads((copy_dir / MARKER).read_text())
        except (OSError, ValueError):
            return False
        _, _, manifest_id = copy_dir.name.partition("-")
        return (
            isinstance(marker, dict)
            and marker.get("store") == self.store_dir
            and marker.get("version") == version
            and marker.get("manifestId") == manifest_id
        )

    def find(self, name: str, ref: FileRef, *, version: int, manifest_id: str) -> Path | None:
        """A local file with the content `ref` describes, checked by size and checksum, or None.
        Copies of `version` made by another attempt than `manifest_id` are never used. A damaged
        candidate is reported and skipped, so the caller downloads that one file."""
        for copy in self.copies():
            if copy.version == version and copy.manifest_id != manifest_id:
                continue
            try:
                candidate = Path(local_file_in(copy.path, name, store=self.store_dir, version=version))
            except InvalidPathError:
                return None
            try:
                st = candidate.lstat()
                if not stat.S_ISREG(st.st_mode) or st.st_size != ref.size:
                    continue
                size, found = file_checksum(candidate)
            except OSError:
                continue
            if size == ref.size and found == ref.checksum:
                return candidate
            log.warning(
                "local recovery copy %s of store %s (version %d) does not match the manifest "
                "(checksum %s, expected %s); fetching it from the checkpoint instead",
                candidate,
                self.store_dir,
                version,
                found,
                ref.checksum,
            )
        return None

    def prune(
        self,
        *,
        keep_newest: int,
        drop_manifest_ids: frozenset[str] = frozenset(),
        complete: list[LocalCopy] | None = None,
    ) -> None:
        """Removes copies beyond the newest `keep_newest`, copies of superseded attempts, and leftovers
        of interrupted saves. Only directories of this store's own layout are touched. `complete`:
        the complete copies when the caller knows them, else they are listed."""
        if not self.dir.is_dir():
            return
        if complete is None:
            complete = self.copies()
        else:
            complete = sorted(complete, key=lambda c: c.version, reverse=True)
        keep = {c.path for c in complete[:keep_newest] if c.manifest_id not in drop_manifest_ids}
        for d in self.dir.iterdir():
            if version_prefix(d.name) is not None and d.is_dir() and d not in keep:
                local_disk.DISK.remove_tree(str(d))

    def discard(self, version: int, manifest_id: str) -> None:
        """Forgets the copy of this version and attempt (one found unusable)."""
        for c in self.copies():
            if c.version == version and c.manifest_id == manifest_id:
                local_disk.DISK.remove_tree(str(c.path))

    def drop_superseded(self, version: int, manifest_id: str) -> None:
        """Forgets copies (and kept changes) of `version` made by an attempt whose manifest another
        attempt replaced."""
        for c in self.copies():
            if c.version == version and c.manifest_id != manifest_id:
                local_disk.DISK.remove_tree(str(c.path))
        self._drop_changes_of_other_attempts(version, manifest_id)

    def forget_later_versions(self, version: int) -> None:
        """Forgets copies and kept changes of versions after `version`, which the store has just
        committed: they belong to a history it left (the checkpoint deleted and the query started
        again at the same path, or rolled back to an earlier batch), so no restore of this history
        can use them, and left in place their higher versions would outrank this history's copies
        whenever copies are pruned. A straggling attempt of an older version (a speculative task
        not yet killed) may remove a newer copy: that costs a restore a download, never a wrong
        state, since every local file is checked against its manifest. Reads names only (this runs
        on every commit) and never raises."""
        if not self.enabled:
            return
        try:
            for d in (self.root, self.root / LAYOUT, self.dir):  # never through a link or someone else's
                make_private_dir(d, create=False)
            entries = list(os.scandir(self.dir))
        except OSError:
            return  # no copies yet, or not a directory of ours: nothing to forget
        for entry in entries:
            later = version_prefix(entry.name)
            if later is not None and later > version and entry.is_dir(follow_symlinks=False):
                local_disk.DISK.remove_tree(entry.path)
        self._forget_changes_after(version)


def clean_stale_stores(root: Path, store_exists: Callable[[str], bool], *, older_than_s: float = 3600.0) -> int:
    """Removes copies of stores whose checkpoint no longer exists. Only our layout is touched:
    directories under <root>/v1 whose copies carry our marker naming the store."""
    removed = 0
    base = root / LAYOUT
    if not base.is_dir() or base.is_symlink() or root.is_symlink():
        return 0
    now = time.time()
    for store in base.iterdir():
        markers = (
            [*store.glob(f"*/{MARKER}"), *store.glob(f"{CHANGES_DIR}/{CHANGES_MARKER}")]
            if store.is_dir() and not store.is_symlink()
            else []
        )
        if not markers:
            continue
        try:  # another worker on this host may be removing the same store's copies
            info = json.loads(markers[0].read_text())
            # The newest marker: kept changes' marker is written once, when the store starts keeping them.
            age = now - max(m.stat().st_mtime for m in markers)
        except (OSError, ValueError):
            continue
        if not isinstance(info, dict) or store_key(str(info.get("store", ""))) != store.name:
            continue  # a marker that does not describe its directory: not ours to judge
        if age > older_than_s and not store_exists(info.get("store", "")):
            local_disk.DISK.remove_tree(str(store))
            removed += 1
    return removed
