"""An independent referee of a pystatestore checkpoint.

It reads a store directory with its own few lines of code and imports nothing from `pystatestore`:
all it knows is the documented file format (docs/ARCHITECTURE.md §5 and §8). So a bug in the
product's manifest parser, chain walk or garbage collection cannot hide from it by agreeing with
itself. Chaos, the model test and the GC tests judge with it.

For a store it says:
- *lost*: a file a manifest names that is missing (but for the changes file of a version that has a
  snapshot, which the store deletes once the snapshot exists), or whose size or CRC-32 differs; data stored
  inside a manifest or snapshot whose size or CRC-32 differs; a retained version whose manifest is
  missing or unreadable, or whose changelog chain breaks before a snapshot (a missing parent
  manifest, or a parent that is another attempt than the one its child was committed on);
- *orphans*: files older than the grace that nothing present needs (data files no manifest or
  snapshot names, snapshots of attempts the checkpoint no longer holds, expired leases, stale
  temporaries), and manifests no retained version needs;
- *needed*: every file the present manifests and their snapshots name, and the manifests and
  snapshots themselves.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DATA_DIRS = ("shared", "private", "changelog", "snapshots")
_VERSION_FILE = re.compile(r"^(\d+)\.json$")
# Spark's checkpoint format v2: one manifest per attempt, named by its checkpoint id (= manifest id).
_ATTEMPT_FILE = re.compile(r"^(\d+)-([0-9a-f]{32})\.json$")
_REPLACED_FILE = re.compile(r"^\.replaced-(\d+)\.json-")
_SNAPSHOT_FILE = re.compile(r"^(\d+)-([0-9a-f]{32})\.json$")


@dataclass
class StoreVerdict:
    store: Path
    versions: list[int] = field(default_factory=list)  # versions with a manifest
    retained: list[int] = field(default_factory=list)
    files_checked: int = 0  # files on disk checked against their size and CRC-32
    inline_checked: int = 0  # payloads stored inside manifests and snapshots checked
    lost: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    needed: set[str] = field(default_factory=set)  # paths relative to the store


def crc32_of(data: bytes) -> str:
    return f"crc32:{zlib.crc32(data) & 0xFFFFFFFF:08x}"


def stores_under(checkpoint: Path) -> list[Path]:
    """Every store directory of a Spark checkpoint (or of a state directory): those holding manifests/."""
    return sorted(p.parent for p in Path(checkpoint).rglob("manifests") if p.is_dir())


def judge_checkpoint(checkpoint: Path, **kwargs: Any) -> list[StoreVerdict]:
    return [judge_store(store, **kwargs) for store in stores_under(checkpoint)]


def judge_store(
    store: Path,
    *,
    min_batches_to_retain: int | None = None,
    required: Iterable[int] = (),
    unrestorable: Iterable[int] = (),
    now: float | None = None,
    grace_seconds: float = 0.0,
    in_flight_seconds: float | None = None,
    snapshotted_changes_kept: bool = False,
) -> StoreVerdict:
    """Judges one store directory.

    `min_batches_to_retain`: Spark's conf; versions from the newest less it on are retained (with
    the version whose manifest was written last), and manifests no retained version's chain needs
    are orphans. None retains every version present. `required`: versions that must be restorable
    whatever is present (e.g. those Spark's commit log still names). `unrestorable`: versions the
    caller knows cannot be restored (their parent attempt was replaced after they were committed
    on it): their chains are not judged. `grace_seconds` is the
    store's orphanGraceSeconds: a snapshot younger than it keeps the chain before it. Files modified
    less than `in_flight_seconds` (default: the grace) before `now` are never orphans: they may
    belong to a commit in flight (0 once the query has stopped). `snapshotted_changes_kept`: the
    store keeps the changes files of versions that have a snapshot (keepSnapshottedChanges).
    """
    store = Path(store)
    now = time.time() if now is None else now
    in_flight = grace_seconds if in_flight_seconds is None else in_flight_seconds
    verdict = StoreVerdict(store)
    manifests = _manifests(store, verdict)
    verdict.versions = sorted({v for v, _ in manifests})
    snapshots = _snapshots(store, manifests, verdict)

    # Every file a present manifest or snapshot names must be there, whole; but the changes file of
    # a changelog version that has a snapshot is deleted once the snapshot exists (unless the store
    # keeps them): there it is optional, and an orphan once old.
    for (v, _cid), (rel, doc) in sorted(manifests.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        verdict.needed.add(rel)
        snapshotted = doc.get("kind", "snapshot") == "changelog" and (v, doc.get("manifest_id")) in snapshots
        _check_refs(store, rel, doc, verdict, changes_optional=snapshotted and not snapshotted_changes_kept)
    for _key, (rel, doc) in sorted(snapshots.items()):
        verdict.needed.add(rel)
        _check_refs(store, rel, doc, verdict)

    retained = set(verdict.versions)
    if min_batches_to_retain is not None and verdict.versions:
        lowest = max(verdict.versions) - max(min_batches_to_retain, 0)
        retained = {v for v in verdict.versions if v >= lowest}
        last = _last_written(store, manifests)
        if last is not None:
            retained.add(last)
    retained |= set(required)
    verdict.retained = sorted(retained)
    broken = set(unrestorable)

    young = {key for key, (rel, _doc) in snapshots.items() if not _old(store / rel, now, grace_seconds)}
    chains: set[str] = set()  # manifests some retained version's restore reads
    for v in verdict.retained:
        attempts = [key for key in manifests if key[0] == v]
        if v in broken:
            chains |= {manifests[key][0] for key in attempts}
            continue
        if not attempts:
            verdict.lost.append(f"manifests/{v}.json (missing; version {v} must be restorable)")
        for key in attempts:  # under checkpoint ids Spark's commit log may name any attempt
            chains |= _walk_chain(key, manifests, snapshots, verdict, young)
    if min_batches_to_retain is not None:
        for (v, _cid), (rel, _doc) in sorted(manifests.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
            if rel not in chains and _old(store / rel, now, in_flight):
                verdict.orphans.append(f"{rel} (version {v}: no retained version needs it)")

    for rel in listing(store):
        top = rel.split("/", 1)[0]
        name = rel.rsplit("/", 1)[-1]
        if not _old(store / rel, now, in_flight):
            continue
        if top in DATA_DIRS and rel not in verdict.needed:
            verdict.orphans.append(f"{rel} (no manifest or snapshot names it)")
        elif top == "leases":
            verdict.orphans.append(f"{rel} (an expired lease)")
        elif top == "manifests" and name.startswith(".tmp-"):
            verdict.orphans.append(f"{rel} (a stale temporary)")
        elif (
            top == "manifests"
            and (m := _REPLACED_FILE.match(name))
            and manifests.get((int(m.group(1)), None), ("",))[0] != rel
        ):
            verdict.orphans.append(f"{rel} (set aside, and its version has a manifest)")
    return verdict


def listing(store: Path) -> list[str]:
    """Every file of the store's own directories, relative to it."""
    return sorted(
        str(p.relative_to(store))
        for top in (*DATA_DIRS, "leases", "manifests")
        for p in (store / top).rglob("*")
        if p.is_file() and not p.is_symlink()
    )


def _old(path: Path, now: float, grace_seconds: float) -> bool:
    try:
        return now - path.stat().st_mtime >= grace_seconds
    except FileNotFoundError:
        return False


def _read_json(store: Path, rel: str, verdict: StoreVerdict) -> dict[str, Any] | None:
    try:
        doc = json.loads((store / rel).read_bytes())
    except (OSError, ValueError) as e:
        verdict.lost.append(f"{rel} (unreadable: {e})")
        return None
    if not isinstance(doc, dict):
        verdict.lost.append(f"{rel} (not a JSON object)")
        return None
    return doc


def _manifests(store: Path, verdict: StoreVerdict) -> dict[tuple[int, str | None], tuple[str, dict[str, Any]]]:
    """(version, checkpoint id or None) -> (path, parsed manifest). A version without a final
    manifest is served by the newest manifest set aside for it (a crash between the two renames of
    an overwrite). Under checkpoint format v2 each attempt has its own `<version>-<id>.json`."""
    found: dict[tuple[int, str | None], tuple[str, dict[str, Any]]] = {}
    aside: dict[int, list[Path]] = {}
    directory = store / "manifests"
    for p in sorted(directory.iterdir()) if directory.is_dir() else []:
        if m := _VERSION_FILE.match(p.name):
            doc = _read_json(store, f"manifests/{p.name}", verdict)
            if doc is not None:
                found[(int(m.group(1)), None)] = (f"manifests/{p.name}", doc)
        elif m := _ATTEMPT_FILE.match(p.name):
            doc = _read_json(store, f"manifests/{p.name}", verdict)
            if doc is None:
                continue
            if doc.get("manifest_id") != m.group(2) or doc.get("checkpoint_id") != m.group(2):
                verdict.lost.append(f"manifests/{p.name} (describes attempt {doc.get('manifest_id')!r})")
                continue
            found[(int(m.group(1)), m.group(2))] = (f"manifests/{p.name}", doc)
        elif m := _REPLACED_FILE.match(p.name):
            aside.setdefault(int(m.group(1)), []).append(p)
    for v, paths in aside.items():
        if (v, None) not in found:
            newest = max(paths, key=lambda p: p.stat().st_mtime)
            doc = _read_json(store, f"manifests/{newest.name}", verdict)
            if doc is not None:
                found[(v, None)] = (f"manifests/{newest.name}", doc)
    for key, (rel, doc) in list(found.items()):
        if doc.get("version") != key[0]:
            verdict.lost.append(f"{rel} (describes version {doc.get('version')!r}, not {key[0]})")
            del found[key]
    return found


def _snapshots(
    store: Path, manifests: dict[tuple[int, str | None], tuple[str, dict[str, Any]]], verdict: StoreVerdict
) -> dict[tuple[int, str], tuple[str, dict[str, Any]]]:
    """(version, manifest id) -> (path, parsed snapshot) for the snapshots of attempts the
    checkpoint holds; a snapshot of another attempt is nobody's (an orphan once old)."""
    found = {}
    directory = store / "snapshots"
    for p in sorted(directory.iterdir()) if directory.is_dir() else []:
        m = _SNAPSHOT_FILE.match(p.name)
        if m is None:
            continue
        v, mid = int(m.group(1)), m.group(2)
        held = manifests.get((v, None)) or manifests.get((v, mid))
        if held is None or held[1].get("manifest_id") != mid:
            continue
        doc = _read_json(store, f"snapshots/{p.name}", verdict)
        if doc is None:
            continue
        if doc.get("version") != v or doc.get("manifest_id") != mid or doc.get("kind", "snapshot") != "snapshot":
            verdict.lost.append(f"snapshots/{p.name} (does not describe attempt {mid} of version {v} as a snapshot)")
            continue
        found[(v, mid)] = (f"snapshots/{p.name}", doc)
    return found


def _refs(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(what, reference) for every file a manifest or snapshot names or holds inside."""
    out = [
        (f"{kind} file {name}", ref) for kind in ("shared", "private") for name, ref in (doc.get(kind) or {}).items()
    ]
    if doc.get("changes") is not None:
        out.append(("changes", doc["changes"]))
    return out


def _safe_relative(path: Any) -> bool:
    return (
        isinstance(path, str)
        and path != ""
        and not path.startswith("/")
        and "\\" not in path
        and "\0" not in path
        and ":" not in path
        and all(part not in ("", ".", "..") for part in path.split("/"))
    )


def _check_refs(
    store: Path, rel: str, doc: dict[str, Any], verdict: StoreVerdict, *, changes_optional: bool = False
) -> None:
    for what, ref in _refs(doc):
        if changes_optional and what == "changes" and "data" not in ref:
            continue  # neither needed nor lost: an orphan once old, if still there
        if (
            not isinstance(ref, dict)
            or not isinstance(ref.get("size"), int)
            or not isinstance(ref.get("checksum"), str)
        ):
            verdict.lost.append(f"{rel}: {what} (a malformed reference)")
            continue
        if "data" in ref:
            verdict.inline_checked += 1
            try:
                body = base64.b64decode(ref["data"], validate=True)
            except (binascii.Error, ValueError, TypeError):
                verdict.lost.append(f"{rel}: {what} stored inside (not base64)")
                continue
            if len(body) != ref["size"] or crc32_of(body) != ref["checksum"]:
                verdict.lost.append(f"{rel}: {what} stored inside (size or CRC-32 differs)")
            continue
        path = ref.get("path")
        if not _safe_relative(path):
            verdict.lost.append(f"{rel}: {what} at {path!r} (a path outside the store)")
            continue
        verdict.needed.add(path)
        verdict.files_checked += 1
        target = store / path
        if target.is_symlink() or not target.is_file():
            verdict.lost.append(f"{path} (missing; named by {rel})")
            continue
        body = target.read_bytes()
        if len(body) != ref["size"] or crc32_of(body) != ref["checksum"]:
            verdict.lost.append(f"{path} (size or CRC-32 differs; named by {rel})")


def _walk_chain(
    start: tuple[int, str | None],
    manifests: dict[tuple[int, str | None], tuple[str, dict[str, Any]]],
    snapshots: dict[tuple[int, str], tuple[str, dict[str, Any]]],
    verdict: StoreVerdict,
    young: set[tuple[int, str]],
) -> set[str]:
    """The manifests restoring attempt `start` (version, checkpoint id) reads: from it back to a
    snapshot (its own manifest, or one maintenance made of it) or to version 1. Records a break as
    lost. Past a snapshot maintenance made less than the grace ago (`young`), the chain back to the
    snapshot before it is kept too (restores that began before it appeared still walk it); a break
    there is no loss, as restores can start from the young snapshot. An attempt named by its id
    names its parent by id too (`parent_manifest_id`)."""
    walked: set[str] = set()
    key = start
    version = start[0]
    past_snapshot = False
    while True:
        v = key[0]
        rel, doc = manifests[key]
        walked.add(rel)
        if doc.get("kind", "snapshot") != "changelog":
            return walked
        snap = (v, doc.get("manifest_id"))
        if snap in snapshots:
            if past_snapshot or snap not in young:
                return walked
            past_snapshot = True
        base, parent_id = doc.get("base_version"), doc.get("parent_manifest_id")
        if base != v - 1:
            verdict.lost.append(f"{rel} (a changelog manifest based on {base!r}, not {v - 1})")
            return walked
        if base == 0:
            return walked
        parent_key = (base, parent_id if key[1] is not None else None)
        parent = manifests.get(parent_key)
        if parent is None or parent[1].get("manifest_id") != parent_id:
            if past_snapshot:
                return walked
            if parent is None:
                name = f"{base}-{parent_id}.json" if key[1] is not None else f"{base}.json"
                verdict.lost.append(f"manifests/{name} (missing; the chain of version {version} needs it)")
            else:
                verdict.lost.append(
                    f"{parent[0]} (attempt {parent[1].get('manifest_id')}, but version {v} was committed on "
                    f"attempt {parent_id}; the chain of version {version} breaks)"
                )
            return walked
        key = parent_key


def _last_written(store: Path, manifests: dict[tuple[int, str | None], tuple[str, dict[str, Any]]]) -> int | None:
    """The version whose manifest was written last (newest mtime, then higher version): retention
    keeps it whatever its number, as the next commit builds on it."""
    written = [((store / rel).stat().st_mtime, v) for (v, _), (rel, _) in manifests.items() if (store / rel).exists()]
    return max(written)[1] if written else None
