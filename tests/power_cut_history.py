"""Histories of one store run on a recording disk, and the check of every power cut of them.

A history commits versions (changelog commits durable first, as the worker's service makes them,
or snapshot commits), makes maintenance snapshots and collects garbage, with local recovery copies
of every version and changes big enough to be stored in files of their own. Every commit's reply is
marked in the log, with Spark's commit log written after it as Spark writes it. For each cut
(`power_cut.crash_image`) the disk is rebuilt in place and the store restarted as a new worker
would, and:
- the version of the last reply before the cut loads, and holds exactly the state the history's
  input gives it (the referee is the input, not the product);
- `pystatestore verify --deep` of the checkpoint passes, or names only versions no reply covered;
- a next commit on it succeeds and reads back, and the independent referee (tests/referee.py)
  finds nothing lost in what is then retained.
"""

from __future__ import annotations

import random
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from backend_support import changes, make_backend, materialize_if_due, state_of
from power_cut import KINDS, Image, RecordingDisk, crash_image, disk_tree
from pystatestore.reading.checkpoint import open_checkpoint
from pystatestore.store import frames, local_disk
from pystatestore.store.backends import StateBackend
from pystatestore.tools.verification import verify_checkpoint
from referee import judge_store

RETAIN = 2
MIN_DELTAS = 2
GRACE = 600.0
# A store directory where Spark puts operator 0's partition 1 (backend_support's store identity).
STORE = Path("ckpt") / "state" / "0" / "1"
RECOVERY = Path("recovery")
BASE_OPTIONS = {
    "inlineThresholdBytes": "512",  # changes of a few big values go to changelog/ as files
    "localRecoveryInterval": "1",  # a local copy of every version
    "rocksdb.l0CompactionTrigger": "2",
    "transferThreads": "2",
}


@dataclass(frozen=True)
class HistorySpec:
    name: str
    mode: str  # changelog | snapshot
    durable_first: bool
    steps: tuple[str, ...]  # commit | big (a commit of big values) | snapshot | gc (past the grace)
    options: tuple[tuple[str, str], ...] = ()
    seed: int = 7

    def backend_options(self, root: Path) -> dict[str, str]:
        return {**BASE_OPTIONS, **dict(self.options), "localRecoveryDir": str(root / RECOVERY)}


SHORT = (
    HistorySpec(
        "changelog-durable-first",
        "changelog",
        True,
        ("big", "commit", "snapshot", "commit", "big", "gc", "big"),
    ),
    HistorySpec(
        "snapshot-commits",
        "snapshot",
        False,
        ("commit", "big", "commit", "big", "commit", "gc", "commit"),
        options=(("compactSnapshotMaxBytes", "0"),),
    ),
)


@dataclass
class Recording:
    spec: HistorySpec
    root: Path
    events: list
    expected: dict[int, dict[bytes, bytes]]  # version -> its state, from the history's input
    points: set[str]
    final_tree: dict[str, bytes | None]


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
    )


def _commit(
    backend: StateBackend,
    base: int,
    table: pa.Table,
    num_keys: int,
    durable_first: bool,
    on_reply: Callable[[int], None],
) -> None:
    """A commit as the worker's service makes it: the reply first, then what a durable-first
    commit leaves for after it."""
    view = Path(backend.ctx.views_dir) / f"commit-{uuid.uuid4().hex}"
    try:
        result = backend.commit(
            base,
            table,
            f"attempt-{base + 1}",
            backend.db.manifest_id if base else None,
            num_keys=num_keys,
            view_dir=str(view),
            durable_first=durable_first,
        )
        on_reply(result.version)
        if result.finish is not None:
            result.finish()
    finally:
        shutil.rmtree(view, ignore_errors=True)


def write_spark_commit(root: Path, version: int) -> None:
    """What Spark writes once a batch's commits replied: the batch's offsets and commit log entry."""
    ckpt = root / "ckpt"
    for d in ("offsets", "commits"):
        (ckpt / d).mkdir(parents=True, exist_ok=True)
    (ckpt / "metadata").write_text('{"id":"power-cut"}\n')
    (ckpt / "offsets" / str(version - 1)).write_text("v1\n{}\n{}\n")
    (ckpt / "commits" / str(version - 1)).write_text("v1\n{}\n")


def run_history(spec: HistorySpec, root: Path, off: frozenset[str] = frozenset()) -> Recording:
    """Runs `spec` under `root` on a recording disk (`off`: fsync points left out)."""
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    disk = RecordingDisk(root, off)
    rng = random.Random(spec.seed)
    expected: dict[int, dict[bytes, bytes]] = {0: {}}
    saved = local_disk.DISK
    local_disk.DISK = disk
    work = Path(tempfile.mkdtemp(prefix="power-cut-work-"))
    backend = _backend(spec, root, work)
    version = 0

    def replied(v: int) -> None:
        disk.ack(v)
        write_spark_commit(root, v)

    try:
        for step in spec.steps:
            if step in ("commit", "big"):
                state = dict(expected[version])
                puts, deletes = change_set(rng, state, big=step == "big")
                table = frames.sorted_by_key(changes(puts, deletes))
                frames.apply_changes(state, table)
                _commit(backend, version, table, len(state), spec.durable_first, replied)
                version += 1
                expected[version] = state
            elif step == "snapshot":
                materialize_if_due(backend)
            elif step == "gc":  # past the orphan grace: chains a snapshot replaced go too
                backend.maintenance(time.time() + GRACE + 1)
            else:
                raise ValueError(f"unknown step {step!r}")
    finally:
        backend.close()
        local_disk.DISK = saved
        shutil.rmtree(work, ignore_errors=True)
    spark_files = ("ckpt/metadata", "ckpt/offsets", "ckpt/commits")  # Spark's, not the store's
    tree = {p: c for p, c in disk_tree(root).items() if not p.startswith(spark_files)}
    return Recording(spec, root, disk.events, expected, disk.points, tree)


@dataclass
class CutReport:
    cuts: int = 0  # (cut, kind, draw) combinations looked at
    images: int = 0  # distinct images checked (the same image at two cuts is checked once)
    failures: list[str] = field(default_factory=list)


def check_image(recording: Recording, image: Image) -> list[str]:
    """Restarts the store on `image` (already written at the recording's root); the problems found."""
    spec, root = recording.spec, recording.root
    acked = max(image.acks, default=0)
    for v in range(1, acked + 1):
        write_spark_commit(root, v)
    problems: list[str] = []
    if acked:
        report = verify_checkpoint(open_checkpoint(str(root / "ckpt")), deep=True)
        for p in report.problems:
            if p.version is None or p.version <= acked:
                problems.append(f"verify: {p}")
    work = Path(tempfile.mkdtemp(prefix="power-cut-restart-"))
    try:
        backend = _backend(spec, root, work)
        try:
            if acked:
                got = state_of(backend, acked)
                if got != recording.expected[acked]:
                    problems.append(f"version {acked} (replied) restored {len(got)} keys, not its state")
            state = dict(recording.expected[acked])
            table = frames.sorted_by_key(changes({b"after-restart": b"x"}))
            frames.apply_changes(state, table)
            _commit(backend, acked, table, len(state), spec.durable_first, lambda v: None)
        finally:
            backend.close()
        reader = _backend(spec, root, work / "reader")
        try:
            if state_of(reader, acked + 1) != state:
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


def check_cuts(
    recording: Recording,
    *,
    cuts: list[int] | None = None,
    kinds: tuple[str, ...] = KINDS,
    mixed_draws: int = 2,
    seed: int = 0,
    stop_at_first: bool = False,
) -> CutReport:
    """Checks the image of every cut in `cuts` (default: after each event, and before the first)."""
    report = CutReport()
    seen: set[tuple[str, int]] = set()
    for cut in range(len(recording.events) + 1) if cuts is None else cuts:
        for kind in kinds:
            for draw in range(mixed_draws if kind == "mixed" else 1):
                report.cuts += 1
                image = crash_image(recording.events, cut, kind, random.Random(f"{seed}-{cut}-{draw}"))
                key = (image.signature(), max(image.acks, default=0))
                if key in seen:
                    continue
                seen.add(key)
                report.images += 1
                image.materialize(recording.root)
                for problem in check_image(recording, image):
                    report.failures.append(f"cut {cut} ({kind} {draw}): {problem}")
                if stop_at_first and report.failures:
                    return report
    return report
