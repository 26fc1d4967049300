"""Local recovery copies (Flink's TaskLocalStateStore; DESIGN §5).

After a commit, the version's RocksDB checkpoint (hard links, so nearly free) is kept in a
directory that outlives the executor, on the same host. A restore then takes each file the
manifest lists from a local copy when its size and checksum match, and downloads only what is
missing or damaged. Writing a copy never fails a commit: problems are logged once per store and
the store carries on without local copies.

Layout (everything this module ever deletes lies inside it):
    <root>/v1/<store key>/<version>-<manifest id>/   files of that version's checkpoint
    <root>/v1/<store key>/<version>-<manifest id>/.pystatestore-copy.json   written last
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .manifest import FileRef

MARKER = ".pystatestore-copy.json"
LAYOUT = "v1"
DEFAULT_VERSIONS_KEPT = 2
log = logging.getLogger("pystatestore.local_recovery")


def default_root() -> Path:
    """Outside Spark's per-application temp dirs, so a restarted executor on this host finds it."""
    return Path(tempfile.gettempdir()) / "pystatestore-local-recovery"


def store_key(store_dir: str) -> str:
    return hashlib.sha256(store_dir.encode()).hexdigest()[:24]


def file_checksum(path: Path) -> tuple[int, str]:
    crc, size = 0, 0
    with open(path, "rb") as f:
        while chunk := f.read(4 << 20):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return size, f"crc32:{crc & 0xFFFFFFFF:08x}"


@dataclass(frozen=True)
class LocalCopy:
    version: int
    manifest_id: str
    path: Path


class LocalRecoveryStore:
    """The local copies of one store on this host."""

    def __init__(self, root: Path, store_dir: str, versions_kept: int = DEFAULT_VERSIONS_KEPT) -> None:
        self.store_dir = store_dir
        self.versions_kept = max(1, versions_kept)
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

    def save(self, version: int, manifest_id: str, checkpoint_dir: Path) -> bool:
        """Keeps `checkpoint_dir` (moved, not copied) as the local copy of `version`. Never raises."""
        if not self.enabled:
            return False
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            target = self.dir / f"{version}-{manifest_id}"
            try:
                os.rename(checkpoint_dir, target)
            except OSError:  # another filesystem: copy, hard links are impossible
                shutil.copytree(checkpoint_dir, target)
            marker = {"store": self.store_dir, "version": version, "manifestId": manifest_id, "savedAt": time.time()}
            (target / MARKER).write_text(json.dumps(marker))
            self.prune(keep_newest=self.versions_kept)
            return True
        except OSError as e:
            self._disable(f"{type(e).__name__}: {e}")
            return False

    def copies(self) -> list[LocalCopy]:
        """Complete copies, newest first. Incomplete ones (no marker) are ignored."""
        if not self.enabled or not self.dir.is_dir():
            return []
        found = []
        for d in self.dir.iterdir():
            version, _, manifest_id = d.name.partition("-")
            if d.is_dir() and version.isdigit() and (d / MARKER).is_file():
                found.append(LocalCopy(int(version), manifest_id, d))
        return sorted(found, key=lambda c: c.version, reverse=True)

    def find(self, name: str, ref: FileRef, *, version: int) -> Path | None:
        """A local file with the content `ref` describes, checked by size and checksum, or None.
        A damaged candidate is reported and skipped, so the caller downloads that one file."""
        for copy in self.copies():
            candidate = copy.path / name
            try:
                if not candidate.is_file() or candidate.stat().st_size != ref.size:
                    continue
                size, checksum = file_checksum(candidate)
            except OSError:
                continue
            if size == ref.size and checksum == ref.checksum:
                return candidate
            log.warning(
                "local recovery copy %s of store %s (version %d) does not match the manifest "
                "(checksum %s, expected %s); fetching it from the checkpoint instead",
                candidate,
                self.store_dir,
                version,
                checksum,
                ref.checksum,
            )
        return None

    def prune(self, *, keep_newest: int, drop_manifest_ids: frozenset[str] = frozenset()) -> None:
        """Removes copies beyond the newest `keep_newest`, copies of superseded attempts, and leftovers
        of interrupted saves. Only directories of this store's own layout are touched."""
        if not self.dir.is_dir():
            return
        complete = self.copies()
        keep = {c.path for c in complete[:keep_newest] if c.manifest_id not in drop_manifest_ids}
        for d in self.dir.iterdir():
            version, _, _ = d.name.partition("-")
            if d.is_dir() and version.isdigit() and d not in keep:
                shutil.rmtree(d, ignore_errors=True)

    def drop_superseded(self, version: int, manifest_id: str) -> None:
        """Forgets copies of `version` made by an attempt whose manifest another attempt replaced."""
        for c in self.copies():
            if c.version == version and c.manifest_id != manifest_id:
                shutil.rmtree(c.path, ignore_errors=True)


def clean_stale_stores(root: Path, store_exists: Callable[[str], bool], *, older_than_s: float = 3600.0) -> int:
    """Removes copies of stores whose checkpoint no longer exists. Only our layout is touched:
    directories under <root>/v1 whose copies carry our marker naming the store."""
    removed = 0
    base = root / LAYOUT
    if not base.is_dir():
        return 0
    now = time.time()
    for store in base.iterdir():
        markers = list(store.glob(f"*/{MARKER}")) if store.is_dir() else []
        if not markers:
            continue
        try:
            info = json.loads(markers[0].read_text())
        except (OSError, ValueError):
            continue
        if now - markers[0].stat().st_mtime > older_than_s and not store_exists(info.get("store", "")):
            shutil.rmtree(store, ignore_errors=True)
            removed += 1
    return removed
