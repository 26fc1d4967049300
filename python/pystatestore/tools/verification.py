"""A checkpoint's health and garbage, as plain data: `pystatestore verify` (every retained version
restorable, every file it needs present and intact) and `pystatestore gc --dry-run` (what garbage
collection would delete, and why). Nothing here writes into a checkpoint."""

from __future__ import annotations

import base64
import binascii
import time
from dataclasses import dataclass, field
from typing import Any

from ..reading.checkpoint import SparkCheckpoint
from ..reading.store_reader import StoreReader
from ..store.errors import StateStoreError
from ..store.manifest import (
    MANIFEST_DIR,
    SNAPSHOT_DIR,
    Manifest,
    checkpoint_id_of_manifest,
    checksum,
    manifest_path,
    snapshot_of,
    version_of_manifest,
)
from ..store.remote import RemoteFile, join_uri
from ..store.retention import DATA_DIRS, RetentionPlan, version_of_replaced_manifest
from .inspection import KINDS, Progress, _no_progress


# -- verify ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Problem:
    store: str
    version: int | None
    file: str | None
    problem: str
    advice: str

    def __str__(self) -> str:
        where = [self.store]
        if self.version is not None:
            where.append(f"version {self.version}")
        if self.file:
            where.append(self.file)
        return f"{': '.join([', '.join(where), self.problem])}. {self.advice}"


@dataclass
class VerifyReport:
    stores: int = 0
    manifests: int = 0
    files: int = 0
    bytes_checked: int = 0
    problems: list[Problem] = field(default_factory=list)
    unreferenced: list[str] = field(default_factory=list)  # store-dir/relative path
    young_unreferenced: list[str] = field(default_factory=list)  # may be commits in flight

    @property
    def restorable(self) -> bool:
        return not self.problems


def _problem_of(e: StateStoreError) -> Problem:
    return Problem(e.store, e.version, e.file, e.problem, e.advice)


def verify_checkpoint(
    ckpt: SparkCheckpoint,
    *,
    deep: bool = False,
    grace_seconds: float = 600.0,
    progress: Progress = _no_progress,
) -> VerifyReport:
    """Every retained manifest parses, validates and belongs to its store (under checkpoint format
    v2, the attempt the commit log names, or every attempt of a version it does not name); every
    file it and its chain need exists with its size (and, `deep`, its checksum, with the data
    stored inside the chain's manifests and its snapshot checked against theirs); the last
    committed batch's version exists in every store. Files no retained version references are listed (those younger
    than `grace_seconds` apart: they may belong to a commit in flight)."""
    report = VerifyReport()
    now = time.time()
    last = ckpt.last_committed_batch
    for i, loc in enumerate(ckpt.stores):
        progress("verifying stores", i, len(ckpt.stores))
        report.stores += 1
        if loc.foreign:
            report.problems.append(
                Problem(loc.uri, None, None, f"the store holds files of {loc.foreign}", "pystatestore cannot check it.")
            )
            continue
        try:
            reader = StoreReader(loc)
        except StateStoreError as e:
            report.problems.append(_problem_of(e))
            continue
        with reader:
            _verify_store(reader, report, deep=deep, now=now, grace=grace_seconds, last_batch=last, progress=progress)
    progress("verifying stores", len(ckpt.stores), len(ckpt.stores))
    return report


def _verify_store(
    reader: StoreReader,
    report: VerifyReport,
    *,
    deep: bool,
    now: float,
    grace: float,
    last_batch: int | None,
    progress: Progress,
) -> None:
    remote = reader.remote
    listed = {f.path: f for d in DATA_DIRS for f in remote.list_files(d.rstrip("/"))}
    referenced: set[str] = set()
    if last_batch is not None and last_batch + 1 not in reader.versions:
        report.problems.append(
            Problem(
                remote.uri,
                last_batch + 1,
                manifest_path(last_batch + 1),
                f"the last committed batch ({last_batch}) needs this version, which has no manifest",
                "A restart fails here. Restore the store directory from a backup, or start from a new checkpoint "
                "location.",
            )
        )
    snapshots = {
        key: f for f in listed.values() if f.path.startswith(SNAPSHOT_DIR + "/") and (key := snapshot_of(f.path))
    }
    checked: set[str] = set()  # versions share most files: each is checked once
    cache: dict[str, Manifest] = {}  # by path, as chains find them
    for v, cid in _attempts_to_check(reader):
        report.manifests += 1
        try:
            m = reader.manifest(v) if cid is None else reader.backend.read_manifest(v, cid)
            cache[m.path] = m
            needed = reader.backend.dependencies(m, snapshots=snapshots, now=now, cache=cache)
            chain = _restore_chain(reader, m, snapshots, cache)
        except StateStoreError as e:
            report.problems.append(_problem_of(e))
            continue
        refs = {r.path: r for c in chain for r in c.files()}
        # (path of the manifest or snapshot, the manifest) whose data stored inside gets checked
        holders = [(c.path, c) for c in chain]
        start = chain[-1]  # where the restore starts: its own snapshot, or one maintenance made
        snap = snapshots.get((start.version, start.manifest_id)) if start.is_changelog else None
        if snap is not None:
            try:
                made = reader.backend.read_snapshot(start.version, start.manifest_id)
            except StateStoreError as e:
                report.problems.append(_problem_of(e))
                made = None
            if made is not None:
                refs.update({r.path: r for r in made.files()})
                holders.append((snap.path, made))
                if start.changes is not None and start.changes.ref.path not in needed:
                    refs.pop(start.changes.ref.path, None)  # deleted once the snapshot was made (0043)
        if deep:
            for holder, held in holders:
                if holder not in checked:
                    checked.add(holder)
                    _check_inline(remote.uri, holder, held, report)
        referenced |= needed | set(refs)
        for path, ref in sorted(refs.items()):
            if path in checked:
                continue
            report.files += 1
            found = listed.get(path)
            if found is None:
                report.problems.append(
                    Problem(
                        remote.uri,
                        v,
                        path,
                        "a file this version needs is missing",
                        "Restoring this version fails. Restore the file from a backup, or restart from an earlier "
                        "retained batch or a new checkpoint location.",
                    )
                )
            elif found.size != ref.size:
                report.problems.append(
                    Problem(
                        remote.uri,
                        v,
                        path,
                        f"the file has {found.size} bytes; the manifest says {ref.size} (truncated or replaced)",
                        "Restoring this version fails. Restore the file from a backup.",
                    )
                )
            elif deep:
                progress(f"checksums of {reader.location.label}", 0, 0)
                data = remote.read_bytes(path, version=v)
                report.bytes_checked += data.size
                if checksum(data) != ref.checksum:
                    report.problems.append(
                        Problem(
                            remote.uri,
                            v,
                            path,
                            f"the file's checksum is {checksum(data)}; the manifest says {ref.checksum} (damaged)",
                            "Restoring this version fails. Restore the file from a backup.",
                        )
                    )
            checked.add(path)
    for path, f in sorted(listed.items()):
        if path in referenced:
            continue
        target = report.young_unreferenced if f.mtime is None or now - f.mtime <= grace else report.unreferenced
        target.append(join_uri(remote.uri, path))


def _attempts_to_check(reader: StoreReader) -> list[tuple[int, str | None]]:
    """(version, checkpoint id) of each manifest to check; None: the one `reader.manifest` reads
    (the only one, or under checkpoint format v2 the attempt Spark's commit log names). A version
    the commit log does not name (yet: Spark writes it after the stores commit, and a crash or a
    power cut can lose it) that several attempts committed has each of them checked: Spark runs
    its batch again, and garbage collection keeps what any of them needs."""
    attempts: dict[int, list[str]] = {}
    for f in reader.remote.list_files(MANIFEST_DIR):
        if (v := version_of_manifest(f.path)) is not None and (cid := checkpoint_id_of_manifest(f.path)) is not None:
            attempts.setdefault(v, []).append(cid)
    found: list[tuple[int, str | None]] = []
    for v in reader.versions:
        unnamed = sorted(attempts.get(v, ())) if v not in reader.attempts else []
        found += [(v, cid) for cid in unnamed] if len(unnamed) > 1 else [(v, None)]
    return found


def _restore_chain(
    reader: StoreReader, m: Manifest, snapshots: dict[tuple[int, str], Any], cache: dict[str, Manifest]
) -> list[Manifest]:
    """The manifests a restore of `m` reads: back to a snapshot manifest, or to the first version
    that has a snapshot maintenance made (garbage collection may have removed the manifests before
    it, which no restore reads any more)."""
    chain = []
    for c in reader.backend.chain_back(m, cache):
        chain.append(c)
        if c.is_changelog and (c.version, c.manifest_id) in snapshots:
            break
    return chain


def _check_inline(store: str, holder: str, m: Manifest, report: VerifyReport) -> None:
    """The data stored inside a manifest or snapshot (small files, a version's changes) against
    their sizes and checksums: a restore through it reads them."""
    inline = [(name, r) for kind in (m.shared, m.private) for name, r in kind.items() if r.inline]
    if m.changes is not None and m.changes.ref.inline:
        inline.append(("changes", m.changes.ref))
    for name, ref in inline:
        report.files += 1
        try:
            content = base64.b64decode(ref.data or "", validate=True)
        except (binascii.Error, ValueError):
            content = None
        report.bytes_checked += len(content or b"")
        if content is None or len(content) != ref.size or checksum(content) != ref.checksum:
            report.problems.append(
                Problem(
                    store,
                    m.version,
                    holder,
                    f"the data of {name} stored inside it does not match its size and checksum (damaged)",
                    "Restoring this version fails. Restore the file from a backup, or restart from an earlier "
                    "retained batch or a new checkpoint location.",
                )
            )


# -- gc --dry-run ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Deletion:
    store: str
    path: str
    size: int
    reason: str


def gc_dry_run(
    ckpt: SparkCheckpoint,
    *,
    min_batches_to_retain: int = 100,
    grace_seconds: float = 600.0,
    now: float | None = None,
    progress: Progress = _no_progress,
) -> list[Deletion]:
    """What the next maintenance run would delete from each store, and why; nothing is deleted.
    `min_batches_to_retain` and `grace_seconds` are the query's spark.sql.streaming.minBatchesToRetain
    and orphanGraceSeconds."""
    now = time.time() if now is None else now
    out: list[Deletion] = []
    for i, loc in enumerate(ckpt.stores):
        progress("planning garbage collection", i, len(ckpt.stores))
        if loc.foreign:
            continue
        with StoreReader(loc, retain=min_batches_to_retain, grace_seconds=grace_seconds) as reader:
            backend = reader.backend
            plan = backend.plan_maintenance(now)
            listing = {f.path: f for kind in KINDS for f in backend.remote.list_files(kind)}
            out += _explain(loc.uri, plan, listing, backend, now)
    progress("planning garbage collection", len(ckpt.stores), len(ckpt.stores))
    return out


def _explain(
    store: str, plan: RetentionPlan, listing: dict[str, RemoteFile], backend: Any, now: float
) -> list[Deletion]:
    manifests = [f for p, f in listing.items() if p.startswith(MANIFEST_DIR + "/")]
    data = [f for p, f in listing.items() if p.startswith(DATA_DIRS)]
    needs = backend.needs_by_version(manifests, data, now=now)
    users: dict[str, list[int]] = {}
    for v, refs in needs.items():
        for p in refs or ():
            users.setdefault(p, []).append(v)
    low = plan.lowest_retained
    out = []
    for p in plan.delete_manifests:
        out.append(
            Deletion(store, p, listing[p].size if p in listing else 0, f"version below the lowest retained ({low})")
        )
    for p in plan.delete_files:
        f = listing.get(p)
        size = f.size if f else 0
        age = f"{now - f.mtime:.0f} s old" if f and f.mtime is not None else "age unknown"
        if p.startswith("leases/"):
            reason = f"an expired commit lease ({age})"
        elif p.startswith(MANIFEST_DIR + "/"):
            rv = version_of_replaced_manifest(p)
            reason = f"a set-aside manifest of version {rv}, replaced" if rv is not None else f"a temporary ({age})"
        elif p in users:
            reason = f"only versions below the lowest retained ({low}) use it (last: {max(users[p])})"
        else:
            reason = f"no manifest references it and it is older than the grace ({age})"
        out.append(Deletion(store, p, size, reason))
    return out


__all__ = ["Deletion", "Problem", "VerifyReport", "gc_dry_run", "verify_checkpoint"]
