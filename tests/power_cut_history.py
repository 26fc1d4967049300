"""Histories of one store run on a recording disk, and the check of every power cut of them.

A history commits versions (changelog commits durable first, as the worker's service makes them,
or snapshot commits, compact or as SSTs, with or without checkpoint ids), makes maintenance
snapshots and collects garbage, with local recovery copies of every version and changes big
enough to be stored in files of their own. It starts where Spark starts a store: in a checkpoint
whose `state/<op>/` Spark made and never synced. Every commit's reply is marked in the log, with
Spark's commit log written after it as Spark writes it. For each cut (`power_cut.crash_image`) the
disk is rebuilt in place and the store restarted as a new worker would, and:
- the version Spark's commit log names loads, and holds exactly the state the history's input
  gives it (the referee is the input, not the product); that is the last replied version, or on
  every other image the one before it (Spark's log a batch behind the store's, as after a cut
  that took Spark's own unsynced log entry), whose batch Spark then runs again: the store commits
  a version it already has, which must then read back as the input gives it;
- `pystatestore verify --deep` of the checkpoint passes, or names only versions no reply covered;
- a next commit on it succeeds and reads back, and the independent referee (tests/referee.py)
  finds nothing lost in what is then retained.
A restart can itself be cut (`check_restart_cuts`): the recovery from a first cut, with its
garbage collection, runs on a recording disk that starts from that cut's image, and each of its
cuts is checked the same way.
"""

from __future__ import annotations

import itertools
import os
import random
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from backend_support import changes, make_backend, materialize_if_due, state_of
from power_cut import KINDS, Image, RecordingDisk, crash_image, disk_tree, pending_names
from pystatestore.reading.checkpoint import open_checkpoint
from pystatestore.store import frames, local_disk
from pystatestore.store.backends import CommitResult, StateBackend
from pystatestore.tools.verification import verify_checkpoint
from referee import judge_store

RETAIN = 2
MIN_DELTAS = 2
GRACE = 600.0
# A store directory where Spark puts operator 0's partition 1 (backend_support's store identity).
STORE = Path("ckpt") / "state" / "0" / "1"
SPARK_DIRS = Path("ckpt") / "state" / "0"  # made by Spark, unsynced, before the store starts
RECOVERY = Path("recovery")
BASE_OPTIONS = {
    "inlineThresholdBytes": "512",  # changes of a few big values go to changelog/ as files
    "localRecoveryInterval": "1",  # a local copy of every version
    "rocksdb.l0CompactionTrigger": "2",
    "transferThreads": "2",
}
# The names a restore walks down a chain: their removals must be durable in order.
CHAIN_DIRS = (f"{STORE.as_posix()}/manifests/", f"{STORE.as_posix()}/snapshots/")
AFTER_RESTART = {b"after-restart": b"x"}
# Thousands of restarts each open RocksDB and remove directories: on a memory filesystem where
# there is one (the images come from the log, not from what the real disk keeps).
SCRATCH = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None

Ack = tuple[int, "str | None"]  # a reply: the version and, with checkpoint ids, its attempt's id


def scratch_dir(prefix: str) -> Path:
    """A new temporary directory, in memory where the machine has a memory filesystem."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=SCRATCH))


@dataclass(frozen=True)
class HistorySpec:
    name: str
    mode: str  # changelog | snapshot
    durable_first: bool
    # commit | big (a commit of big values) | whole (the whole state on an empty base, as Spark's
    # loadEmpty and a state rewrite commit it: a compact snapshot) | snapshot | gc (past the grace)
    steps: tuple[str, ...]
    options: tuple[tuple[str, str], ...] = ()
    seed: int = 7
    checkpoint_ids: bool = False  # checkpoint format v2: manifests/<version>-<id>.json

    def backend_options(self, root: Path) -> dict[str, str]:
        return {**BASE_OPTIONS, **dict(self.options), "localRecoveryDir": str(root / RECOVERY)}


SHORT = (
    HistorySpec(
        "changelog-durable-first",
        "changelog",
        True,
        # Two commits before the snapshot: garbage collection then removes a chain of two manifests.
        ("big", "commit", "commit", "snapshot", "commit", "big", "gc", "big"),
    ),
    HistorySpec(
        "snapshot-commits",
        "snapshot",
        False,
        ("commit", "big", "commit", "big", "commit", "gc", "commit"),
        options=(("compactSnapshotMaxBytes", "0"),),
    ),
    HistorySpec(
        # Compact-snapshot commits (one segment: inside the manifest while small, a file once big
        # values come) and changelog commits on them, under checkpoint ids: every manifest's name
        # carries its attempt's id, and every commit names its base's.
        "compact-commits-checkpoint-ids",
        "changelog",
        True,
        ("whole", "commit", "big", "snapshot", "commit", "gc", "whole", "big"),
        checkpoint_ids=True,
    ),
)


@dataclass
class Recording:
    spec: HistorySpec
    root: Path
    events: list
    expected: dict[int, dict[bytes, bytes]]  # version -> its state, from the history's input
    # version -> the changes that made it, and whether as a whole state (Spark runs its batch again)
    tables: dict[int, tuple[pa.Table, bool]]
    points: set[str]
    final_tree: dict[str, bytes | None]
    base: dict[str, bytes | None] | None = None  # what the disk held before the first event
    base_acks: tuple[Ack, ...] = ()  # replies before the first event (a restart's recording)


def change_set(rng: random.Random, state: dict[bytes, bytes], big: bool) -> tuple[dict[bytes, bytes], list[bytes]]:
    puts = {}
    for _ in range(3 if big else 6):
        key = f"k{rng.randrange(40):02d}".encode()
        puts[key] = (rng.randbytes(400) if big else f"v{rng.randrange(1000)}".encode()) + key
    deletes = [k for k in sorted(state) if k not in puts and rng.random() < 0.15][:2]
    return puts, deletes


def _backend(spec: HistorySpec, root: Path, work: Path) -> StateBackend:
    return make_backend(
        "rocksdb",
        root / STORE,
        work,
        retain=RETAIN,
        grace=GRACE,
        options=spec.backend_options(root),
        mode=spec.mode,
        min_deltas=MIN_DELTAS,
        checkpoint_ids=spec.checkpoint_ids,
    )


def _commit(
    backend: StateBackend,
    base: int,
    table: pa.Table,
    num_keys: int,
    spec: HistorySpec,
    on_reply: Callable[[Ack], None],
    *,
    whole: bool = False,
) -> Ack:
    """A commit as the worker's service makes it (on the version `backend` loaded or committed
    last; `whole`: `table` is the whole new state, on an empty base, read by nothing soon): the
    reply first, then what a durable-first commit leaves for after it."""
    view = Path(backend.ctx.views_dir) / f"commit-{uuid.uuid4().hex}"
    try:
        result: CommitResult = backend.commit(
            base,
            table,
            f"attempt-{base + 1}",
            backend.db.manifest_id if base and not whole else None,
            num_keys=num_keys,
            view_dir=None if whole else str(view),
            durable_first=spec.durable_first,
            empty_base=whole,
        )
        ack = (result.version, result.manifest_id if spec.checkpoint_ids else None)
        on_reply(ack)
        if result.finish is not None:
            result.finish()
        return ack
    finally:
        shutil.rmtree(view, ignore_errors=True)


def write_spark_commit(root: Path, version: int, checkpoint_id: str | None) -> None:
    """What Spark writes once a batch's commits replied: the batch's offsets and commit log entry
    (under checkpoint format v2 naming the attempt of each store: here partition 1's)."""
    ckpt = root / "ckpt"
    for d in ("offsets", "commits"):
        (ckpt / d).mkdir(parents=True, exist_ok=True)
    (ckpt / "metadata").write_text('{"id":"power-cut"}\n')
    (ckpt / "offsets" / str(version - 1)).write_text("v1\n{}\n{}\n")
    ids = "" if checkpoint_id is None else f',"stateUniqueIds":{{"0":[[],["{checkpoint_id}"]]}}'
    (ckpt / "commits" / str(version - 1)).write_text(f'v1\n{{"nextBatchWatermarkMs":0{ids}}}\n')


def _store_tree(root: Path) -> dict[str, bytes | None]:
    spark_files = ("ckpt/metadata", "ckpt/offsets", "ckpt/commits")
    return {p: c for p, c in disk_tree(root).items() if not p.startswith(spark_files)}


def run_history(spec: HistorySpec, root: Path, off: frozenset[str] = frozenset()) -> Recording:
    """Runs `spec` under `root` on a recording disk (`off`: fsync points left out)."""
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    disk = RecordingDisk(root, off)
    rng = random.Random(spec.seed)
    expected: dict[int, dict[bytes, bytes]] = {0: {}}
    tables: dict[int, tuple[pa.Table, bool]] = {}
    saved = local_disk.DISK
    local_disk.DISK = disk
    work = scratch_dir("power-cut-work-")
    version = 0

    def replied(ack: Ack) -> None:
        disk.ack(ack)
        write_spark_commit(root, *ack)

    try:
        disk.mkdirs_unsynced(root / SPARK_DIRS)  # Spark's, before any store of the query opens
        backend = _backend(spec, root, work)
        try:
            for step in spec.steps:
                if step in ("commit", "big", "whole"):
                    state = dict(expected[version])
                    puts, deletes = change_set(rng, state, big=step == "big")
                    table = frames.sorted_by_key(changes(puts, deletes))
                    frames.apply_changes(state, table)
                    if step == "whole":
                        table = frames.sorted_by_key(changes(state))
                    _commit(backend, version, table, len(state), spec, replied, whole=step == "whole")
                    version += 1
                    expected[version], tables[version] = state, (table, step == "whole")
                elif step == "snapshot":
                    materialize_if_due(backend)
                elif step == "gc":  # past the orphan grace: chains a snapshot replaced go too
                    backend.maintenance(time.time() + GRACE + 1)
                else:
                    raise ValueError(f"unknown step {step!r}")
        finally:
            backend.close()
    finally:
        local_disk.DISK = saved
        shutil.rmtree(work, ignore_errors=True)
    return Recording(spec, root, disk.events, expected, tables, disk.points, _store_tree(root))


@dataclass
class CutReport:
    cuts: int = 0  # (cut, kind, draw) combinations looked at
    images: int = 0  # distinct images checked (the same image at two cuts is checked once)
    failures: list[str] = field(default_factory=list)

    def add(self, other: CutReport, label: str) -> None:
        self.cuts += other.cuts
        self.images += other.images
        self.failures += [f"{label}: {f}" for f in other.failures]


@dataclass
class Restarted:
    """What a restart committed: the last version, its reply, and the state it holds."""

    ack: Ack
    state: dict[bytes, bytes]


def restart(
    recording: Recording,
    acks: list[Ack],
    work: Path,
    *,
    behind: bool,
    on_reply: Callable[[Ack], None] = lambda ack: None,
    gc: bool = False,
    problems: list[str],
) -> Restarted:
    """The store restarted as a new worker would, on what the disk holds, with Spark's commit log
    at the last replied version of `acks` (one behind with `behind`): the version the log names
    loads; where the log is behind, Spark runs the next batch again and the store commits a
    version it has (with one more key: the re-run's result differs); then one commit more; with
    `gc`, garbage collection past the grace. What differs from the history's input goes to
    `problems`."""
    spec, root = recording.spec, recording.root
    ids = dict(acks)  # a version replied again (by a restart) counts with its newest attempt
    acked = max(ids, default=0)
    start = acked - 1 if behind and acked else acked
    backend = _backend(spec, root, work)
    try:
        if start:
            got = state_of(backend, start, ids[start])
            if got != recording.expected[start]:
                problems.append(f"version {start} (in Spark's commit log) restored {len(got)} keys, not its state")
        state = dict(recording.expected[acked])
        if start < acked:
            # The batch of `acked` again, and the store commits a version it has. Its result differs
            # a little (a batch may: a clock, a random draw), so what the first attempt left (its
            # local copy, its kept changes) must not be taken for the new one.
            rerun = {f"rerun-{acked}".encode(): b"again"}
            table, whole = recording.tables[acked]
            table = frames.sorted_by_key(pa.concat_tables([table, changes(rerun)]))
            state.update(rerun)
            ack = _commit(backend, start, table, len(state), spec, on_reply, whole=whole)
            if state_of(backend, acked, ack[1]) != state:
                problems.append(f"version {acked}, committed again after the restart, does not read back")
        table = frames.sorted_by_key(changes(AFTER_RESTART))
        frames.apply_changes(state, table)
        ack = _commit(backend, acked, table, len(state), spec, on_reply)
        if gc:
            backend.maintenance(time.time() + GRACE + 1)
    finally:
        backend.close()
    return Restarted(ack, state)


def check_image(recording: Recording, image: Image, *, behind: bool = False) -> list[str]:
    """Restarts the store on `image` (already written at the recording's root); the problems found."""
    acks = [*recording.base_acks, *image.acks]
    ids = dict(acks)
    acked = max(ids, default=0)
    root = recording.root
    for v in range(1, (acked - 1 if behind else acked) + 1):
        write_spark_commit(root, v, ids[v])
    problems: list[str] = []
    work = scratch_dir("power-cut-restart-")
    try:
        if acked:
            report = verify_checkpoint(open_checkpoint(str(root / "ckpt")), deep=True)
            for p in report.problems:
                if p.version is None or p.version <= acked:
                    problems.append(f"verify: {p}")
        done = restart(recording, acks, work, behind=behind, problems=problems)
        reader = _backend(recording.spec, root, work / "reader")
        try:
            if state_of(reader, acked + 1, done.ack[1]) != done.state:
                problems.append(f"version {acked + 1}, committed after the restart, does not read back")
        finally:
            reader.close()
        verdict = judge_store(root / STORE, min_batches_to_retain=RETAIN, required=[acked + 1], grace_seconds=600)
        problems += [f"referee: {lost}" for lost in verdict.lost]
    except Exception as e:  # noqa: BLE001 - any failure of a restart is the finding
        problems.append(f"restart failed: {type(e).__name__}: {e}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return problems


def removal_subsets(recording: Recording, cut: int, rng: random.Random, limit: int = 32) -> list[set[int]]:
    """Where more than one removal of a manifest or snapshot manifest is unsynced at `cut`: every
    subset of them that could survive (`limit` drawn where there are more), as the surviving set
    of `crash_image`. A restore walks a chain down these names, so whichever of them a cut keeps
    must leave every chain still there whole; a seeded draw would find a bad one only by luck."""
    events = recording.events
    pending = pending_names(events, cut)
    removals = [i for i in pending if events[i].op == "unlink" and events[i].path.startswith(CHAIN_DIRS)]
    if len(removals) < 2:
        return []
    if 2 ** len(removals) <= limit:
        return [set(c) for n in range(len(removals) + 1) for c in itertools.combinations(removals, n)]
    return [{i for i in removals if rng.random() < 0.5} for _ in range(limit)]


def check_cuts(
    recording: Recording,
    *,
    cuts: list[int] | None = None,
    kinds: tuple[str, ...] = KINDS,
    mixed_draws: int = 2,
    seed: int = 0,
    stop_at_first: bool = False,
    behind: bool = True,
    removals: bool = True,
) -> CutReport:
    """Checks the image of every cut in `cuts` (default: after each event, and before the first):
    of each kind, `mixed_draws` each of the drawn ones (`mixed`, `subset`), and with `removals`
    every order of the manifest removals unsynced at the cut (`removal_subsets`). With `behind`,
    every other distinct image is judged with Spark's commit log a batch behind."""
    report = CutReport()
    seen: set[tuple[str, int]] = set()
    for cut in range(len(recording.events) + 1) if cuts is None else cuts:
        images: list[tuple[str, Image]] = []
        for kind in kinds:
            for draw in range(mixed_draws if kind in ("mixed", "subset") else 1):
                rng = random.Random(f"{seed}-{cut}-{kind}-{draw}")
                images.append((f"{kind} {draw}", _image(recording, cut, kind, rng)))
        if removals:
            rng = random.Random(f"{seed}-{cut}-removals")
            for n, surviving in enumerate(removal_subsets(recording, cut, rng)):
                images.append((f"removals {n}", _image(recording, cut, "lost", rng, surviving)))
        for label, image in images:
            report.cuts += 1
            acked = max(dict([*recording.base_acks, *image.acks]), default=0)
            key = (image.signature(), acked)
            if key in seen:
                continue
            seen.add(key)
            report.images += 1
            behind_now = behind and acked > 0 and report.images % 2 == 0
            image.materialize(recording.root)
            for problem in check_image(recording, image, behind=behind_now):
                spark = ", Spark's log a batch behind" if behind_now else ""
                report.failures.append(f"cut {cut} ({label}{spark}): {problem}")
            if stop_at_first and report.failures:
                return report
    return report


def _image(recording: Recording, cut: int, kind: str, rng: random.Random, surviving: Any = None) -> Image:
    return crash_image(recording.events, cut, kind, rng, base=recording.base, surviving=surviving)


def record_restart(recording: Recording, first: Image) -> Recording:
    """The restart from `first` (a cut's image, written at the recording's root) recorded as a
    history of its own: it loads the last replied version, commits one more and collects garbage,
    on a recording disk that starts from `first`. Its cuts are a power cut in the middle of the
    recovery from a power cut."""
    root = recording.root
    base = dict(first.tree)
    base_acks = (*recording.base_acks, *first.acks)
    first.materialize(root)
    disk = RecordingDisk(root, base=base)
    saved = local_disk.DISK
    local_disk.DISK = disk
    work = scratch_dir("power-cut-recovery-")
    problems: list[str] = []
    try:
        ids = dict(base_acks)
        for v in range(1, max(ids, default=0) + 1):
            write_spark_commit(root, v, ids[v])

        def replied(ack: Ack) -> None:
            disk.ack(ack)
            write_spark_commit(root, *ack)

        done = restart(recording, list(base_acks), work, behind=False, on_reply=replied, gc=True, problems=problems)
    finally:
        local_disk.DISK = saved
        shutil.rmtree(work, ignore_errors=True)
    if problems:
        raise AssertionError(f"the restart to be cut did not restore the history's state: {problems}")
    version = done.ack[0]
    expected = {v: s for v, s in recording.expected.items() if v < version}
    tables = {v: t for v, t in recording.tables.items() if v < version}
    expected[version], tables[version] = done.state, (frames.sorted_by_key(changes(AFTER_RESTART)), False)
    return replace(
        recording,
        events=disk.events,
        expected=expected,
        tables=tables,
        final_tree=_store_tree(root),
        base=base,
        base_acks=base_acks,
    )


def check_restart_cuts(
    recording: Recording,
    *,
    first_cuts: int,
    kinds: tuple[str, ...] = ("lost", "subset"),
    mixed_draws: int = 1,
    seed: int = 0,
) -> CutReport:
    """Double faults: `first_cuts` cuts of the history drawn (seeded), each one's image (`lost` or
    `subset`, drawn) restarted on a recording disk (`record_restart`), and that restart cut at
    every event and checked (`check_cuts`)."""
    rng = random.Random(f"{seed}-restarts")
    report = CutReport()
    # A cut after the first reply: a restart with nothing replied commits from an empty store.
    first_reply = next(i for i, e in enumerate(recording.events) if e.op == "ack") + 1
    for cut in sorted(rng.sample(range(first_reply, len(recording.events) + 1), first_cuts)):
        kind = rng.choice(("lost", "subset"))
        first = _image(recording, cut, kind, random.Random(f"{seed}-{cut}-first"))
        recovery = record_restart(recording, first)
        found = check_cuts(recovery, kinds=kinds, mixed_draws=mixed_draws, seed=seed)
        report.add(found, f"restart after cut {cut} ({kind}), {len(recovery.events)} events")
    return report
