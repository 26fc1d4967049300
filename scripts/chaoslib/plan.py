"""What one chaos run does, all drawn from its seed: a query (aggregation in update mode,
dropDuplicates with a watermark, applyInPandasWithState with event-time timeouts, a stream-stream
join), a commit mode, where the query stops and restarts, and faults from the menu below; then
what each drawn fault needs set up to fire at all."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from test_e2e import aggregation, pandas_sessions

FILES = 9  # input files, one micro-batch each
# minBatchesToRetain drawn for a retention run: 2-3 of about 9 batches. Run seed 838789598 drew 5
# and its garbage collection deleted nothing while the query ran (at 4 a run deletes about one
# version per store, no margin).
RETAIN_DRAW = (2, 3)
# The points each commit path passes, in order (decisions 0032, 0040): a durable-first changelog
# commit reads and checks the whole frame, writes the segment, stores it, publishes the manifest
# (data and name fsynced) and replies; the apply, the view and the local copy come after the reply.
# An applying-first commit (snapshot mode, or durableFirstCommit=false) writes the change file (and
# segment) and ingests it, makes the view, uploads, publishes, then replies.
DURABLE_FIRST_POINTS = [
    "commit:frame-read",
    "commit:applied",  # the segment written
    "commit:uploaded",
    "commit:manifest-written",
    "apply:started",  # after the reply
    "apply:written",
    "apply:ingested",
    "apply:checkpointed",
]
APPLYING_FIRST_POINTS = [
    "commit:applied",  # the change file (and, in changelog mode, the segment) written
    "commit:flushed",
    "commit:checkpointed",
    "commit:uploaded",
    "commit:manifest-written",
]
APPLY_POINTS = DURABLE_FIRST_POINTS[-4:]


def commit_points(mode: str, durable_first: bool) -> list[str]:
    """The points a commit of this run passes: a fault is drawn only where it can fire."""
    return DURABLE_FIRST_POINTS if mode == "changelog" and durable_first else APPLYING_FIRST_POINTS


RESTORE_POINTS = ["restore:file", "restore:replayed", "download:file"]

# Faults inside the state workers, through the fault seam: each draws its rule's details. "after"
# lets the point pass that many times first, so the fault lands at a random commit or restore.
SEAM_FAULTS: dict[str, Callable[[random.Random, list[str]], dict[str, Any]]] = {
    "worker-exit-mid-commit": lambda r, points: {"point": r.choice(points), "action": "exit", "after": r.randrange(8)},
    "worker-exit-mid-restore": lambda r, _: {
        "point": r.choice(RESTORE_POINTS),
        "action": "exit",
        "after": r.randrange(3),
    },
    "apply-fails": lambda r, _: {
        "point": r.choice(APPLY_POINTS),
        "action": "fail",
        "after": r.randrange(8),
        "times": 2,
    },
    "upload-fails": lambda r, _: {"point": "upload:file", "action": "fail", "after": r.randrange(4), "times": 2},
    "upload-partial": lambda r, _: {"point": "upload:chunk", "action": "fail", "after": r.randrange(4)},
    "upload-slow": lambda r, _: {
        "point": "upload:file",
        "action": "sleep",
        "seconds": round(r.uniform(0.5, 3), 2),
        "after": r.randrange(4),
        "times": 3,
    },
    "download-fails": lambda r, _: {"point": "download:file", "action": "fail", "after": r.randrange(2)},
    "download-partial": lambda r, _: {"point": "download:chunk", "action": "fail", "after": r.randrange(2)},
    "local-disk-full": lambda r, _: {"point": "local-save:moved", "action": "enospc", "after": r.randrange(2)},
}
RESTORE_FAULTS = {"worker-exit-mid-restore", "download-fails", "download-partial"}
DURABLE_FIRST_FAULTS = {"apply-fails"}  # apply points are passed by durable-first commits only
OTHER_FAULTS = ["kill-executor", "local-copy-damage", "maintenance-tiny-grace", "stop-restart"]


def dedup_with_watermark(df: DataFrame) -> DataFrame:
    return df.withWatermark("ts", "10 seconds").dropDuplicates(["id", "ts"]).select("id", "key", "value", "ts")


def stream_join(df: DataFrame) -> DataFrame:
    """An inner stream-stream join on the key within 2 s of event time: four state stores per
    partition (each side's keys and values), evicted as the watermark passes."""
    left = df.where("id % 2 = 0").select(
        F.col("key").alias("lkey"), F.col("ts").alias("lts"), F.col("value").alias("lv")
    )
    right = df.where("id % 2 = 1").select(
        F.col("key").alias("rkey"), F.col("ts").alias("rts"), F.col("value").alias("rv")
    )
    return left.withWatermark("lts", "10 seconds").join(
        right.withWatermark("rts", "10 seconds"),
        F.expr("lkey = rkey AND rts BETWEEN lts - INTERVAL 2 SECONDS AND lts + INTERVAL 2 SECONDS"),
    )


SCENARIOS: dict[str, tuple[Callable[[DataFrame], DataFrame], str]] = {
    "aggregation_update": (aggregation, "update"),
    "dedup_watermark": (dedup_with_watermark, "append"),
    "pandas_timeouts": (pandas_sessions, "update"),
    "stream_join": (stream_join, "append"),
}


@dataclass
class Plan:
    """What one run does, all drawn from its seed."""

    seed: int
    scenario: str
    mode: str
    stops: list[int]  # after this many input files the query stops and restarts
    durable_first: bool = True  # changelog commits: durableFirstCommit (the default) or applying first
    rules: list[dict[str, Any]] = field(default_factory=list)  # the worker fault seam's rules
    executor_kills: list[int] = field(default_factory=list)  # batches after which an executor dies
    local_copy_damage: str | None = None  # "flip" / "delete", between phases
    tiny_grace: bool = False
    local_recovery: bool = True  # off where a fault needs restores to download
    # Stops kill the application's executors, so the restarted query restores every store (from
    # local copies or downloads) instead of finding it still open in a live worker.
    cold_stops: bool = False
    inline_bytes: int | None = None  # 0: every changelog commit and small file is uploaded as a file
    retain: int | None = None  # minBatchesToRetain, with maintenance every second (None: Spark's 100)
    local_copy_interval: int | None = None  # 1: a local copy of every version (faults on local copies)

    def describe(self) -> str:
        parts = [f"{r['fault']} ({r['action']} at {r['point']}, after {r.get('after', 0)})" for r in self.rules]
        parts += [f"kill-executor@batch{b}" for b in self.executor_kills]
        if self.local_copy_damage:
            parts.append(f"local-copy-{self.local_copy_damage}@stops")
        if not self.local_recovery:
            parts.append("no local recovery")
        if self.tiny_grace:
            parts.append("maintenance-grace-10s")
        if self.retain is not None:
            parts.append(f"minBatchesToRetain={self.retain}")
        if self.inline_bytes == 0:
            parts.append("changes in files")
        if self.local_copy_interval is not None:
            parts.append(f"local copy every {self.local_copy_interval} version(s)")
        stops = ",".join(map(str, self.stops)) or "none"
        if self.stops and self.cold_stops:
            stops += " (executors killed at each stop)"
        path = self.mode + (
            "" if self.mode == "snapshot" else "/durable-first" if self.durable_first else "/applying-first"
        )
        return f"{self.scenario}/{path}, stops after files {stops}; faults: {'; '.join(parts) or 'none'}"


def draw(seed: int, tag: str) -> Plan:
    rnd = random.Random(seed)
    plan = Plan(
        seed=seed,
        scenario=rnd.choice(sorted(SCENARIOS)),
        mode=rnd.choice(["changelog", "snapshot"]),
        stops=sorted(rnd.sample(range(2, FILES - 1), rnd.randint(0, 2))),
    )
    plan.durable_first = plan.mode == "changelog" and rnd.random() < 0.75
    points = commit_points(plan.mode, plan.durable_first)
    menu = [f for f in sorted(SEAM_FAULTS) if plan.durable_first or f not in DURABLE_FIRST_FAULTS]
    for fault in rnd.sample(menu + OTHER_FAULTS, rnd.randint(1, 3)):
        if fault in SEAM_FAULTS:
            rule = {"store": tag, "fault": fault, **SEAM_FAULTS[fault](rnd, points)}
            if rule["point"] == "restore:replayed" and plan.mode == "snapshot":
                rule["point"] = "restore:file"  # snapshot commits have no changes to replay
            plan.rules.append(rule)
            if fault in RESTORE_FAULTS:  # restores happen where a query restarts
                plan.stops = plan.stops or [rnd.randrange(2, FILES - 1)]
                plan.local_recovery = plan.local_recovery and not fault.startswith("download")
        elif fault == "kill-executor":
            plan.executor_kills = sorted(rnd.sample(range(1, FILES - 1), rnd.randint(1, 2)))
        elif fault == "local-copy-damage":
            plan.local_copy_damage = rnd.choice(["flip", "delete"])
            if not plan.stops:
                plan.stops = [rnd.randrange(2, FILES - 1)]
        elif fault == "maintenance-tiny-grace":
            plan.tiny_grace = True
        elif fault == "stop-restart":
            plan.stops = sorted(set(plan.stops) | {rnd.randrange(1, FILES)})
    # Drawn last, so that a seed's earlier draws stay what they were before these existed.
    restores_matter = plan.local_copy_damage is not None or any(r["fault"] in RESTORE_FAULTS for r in plan.rules)
    plan.cold_stops = restores_matter or rnd.random() < 0.5
    plan.inline_bytes = rnd.choice([None, 0])
    plan.retain = rnd.randint(*RETAIN_DRAW) if rnd.random() < 0.7 else None
    make_every_fault_fire(plan)
    return plan


def make_every_fault_fire(plan: Plan) -> None:
    """Sets up what each drawn fault needs to happen: a download, or a replay at a restore, needs
    the restore to read the checkpoint (no local copies); a fault on restoring from or saving local
    copies, or damage to them, needs a copy of every version; a transfer fault needs files to
    transfer (changes and small files are otherwise stored inside manifests)."""
    if any(r["point"].startswith("download:") or r["point"] == "restore:replayed" for r in plan.rules):
        plan.local_recovery = False
    # Local saves that fail for want of disk leave no copy to restore from (run seed 2116397989:
    # restore:file "after 2" beside local-save:moved failing, and no restore read a local copy).
    saves_fail = any(r["point"].startswith("local-save:") and r["action"] == "enospc" for r in plan.rules)
    if not plan.local_recovery or saves_fail:
        # Without local copies a restore downloads: the fault goes where the files come from.
        for rule in plan.rules:
            if rule["point"] == "restore:file":
                rule["point"] = "download:file"
    for rule in plan.rules:
        if rule["point"].startswith("download:") or rule["point"] == "restore:replayed":
            # A worker's restore may download one small file and nothing else (one store restored
            # from its compact snapshot: run seed 5685375 drew "after 2", then "after 1", and
            # neither fired); every restore from the checkpoint downloads a first one. "after"
            # counts in each worker process, and a worker may restore one store only, replaying
            # once (run seed 1558735515 drew restore:replayed "after 2": 3 stores over 2
            # executors, and it never fired): every restore of a changelog store replays.
            rule["after"] = 0
    if not plan.local_recovery:  # nothing to save to or damage: those faults cannot fire
        plan.rules = [r for r in plan.rules if r["point"] != "local-save:moved"]
        plan.local_copy_damage = None
    for rule in plan.rules:
        point = rule["point"]
        if point.startswith(("upload:", "download:")) or point == "restore:file":
            plan.inline_bytes = 0
        if point in ("restore:file", "local-save:moved"):
            plan.local_copy_interval = 1
        if point == "restore:replayed":
            # Frequent snapshots could leave nothing to replay: the restore would start at the
            # very version it restores.
            plan.retain = None
    if plan.local_copy_damage is not None:
        plan.local_copy_interval = 1
    if plan.cold_stops and plan.executor_kills:
        # A phase's last batch is followed by a stop that kills every executor: a kill drawn after
        # it finds none left (run seed 2004633997: "after batch 3" before a stop after file 4). It
        # moves to the nearest batch inside a phase, or goes when there is none.
        phase_ends = {stop - 1 for stop in plan.stops}
        free = [b for b in range(1, FILES - 1) if b not in phase_ends and b not in plan.executor_kills]
        kills = []
        for batch in plan.executor_kills:
            if batch in phase_ends:
                if not free:
                    continue
                batch = min(free, key=lambda b, drawn=batch: (abs(b - drawn), b))
                free.remove(batch)
            kills.append(batch)
        plan.executor_kills = sorted(kills)
    # "after" counts in each worker process, and a worker may hold one store only (run seed
    # 657555479 drew apply:written "after 5": its longest phase had 4 batches, a worker one store,
    # and it never fired). A commit fault fires where one store's worker lives through more commits.
    stretch = longest_worker_life(plan)
    for rule in plan.rules:
        if rule["point"] in commit_points(plan.mode, plan.durable_first):
            rule["after"] = min(rule["after"], stretch - 1)


def longest_worker_life(plan: Plan) -> int:
    """The most input files (one batch, so at least one commit per store, each) a worker process is
    sure to live through: stops end every worker when they kill the executors, an executor kill
    after batch b (file b + 1) ends one."""
    ends = {b + 1 for b in plan.executor_kills} | (set(plan.stops) if plan.cold_stops else set())
    edges = [0, *sorted(ends), FILES]
    return max(b - a for a, b in pairwise(edges))
