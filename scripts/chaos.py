"""Fault matrix (issue 11): seeded random runs of stateful queries on `local-cluster[2,1,1024]` with
faults injected, each compared with Spark's HDFS provider on the same input and the same stops: the
output row for row, and the final state of the stateful operator (read with Spark's state data
source at the last batch and two earlier retained ones). Then the checkpoint is judged by the
independent referee (tests/referee.py, which shares no code with the product): every retained
version's chain is whole, every file and every payload stored inside a manifest or snapshot has its
size and CRC-32, and after garbage collection past the grace nothing unneeded remains.

Every drawn fault must fire: the draw sets up what it needs (changes stored in files for transfer
faults, restores from the checkpoint for download faults, local copies at every version for faults
on them), and a run whose drawn fault never happened fails. Half the runs or more draw a small
`minBatchesToRetain` (2-3) with maintenance every second, and must see garbage collection delete
versions while they run.

    .venv/bin/python scripts/chaos.py [--runs 5] [--seed S] [--run-seed X] [--workdir DIR] [--keep]

Each run draws from its own seed (printed; `--run-seed X` replays exactly that run's draw): a
query (aggregation in update mode, dropDuplicates with a watermark, applyInPandasWithState with
event-time timeouts, a stream-stream join), a commit mode, where the query stops and restarts, and
faults from the menu below. Faults inside the state workers go through the test-only fault seam
(`PYSTATESTORE_TEST_FAULTS`, set on the executors of the run's own application, never by a conf);
executor kills are SIGKILLs of the run's own executor JVMs. A failing run prints its seed, its
faults, and the first difference. The last line reads
`chaos: N/N runs exact, state equal, all drawn faults fired, 0 files lost, 0 orphans left`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the end-to-end suite's queries and Spark helpers
# PySpark's Python workers on the local cluster's executors (pandas UDFs) must run this interpreter.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

import referee  # noqa: E402
from backend_support import open_store  # noqa: E402
from spark_support import HDFS_PROVIDER, OUR_PROVIDER, run_phase, start_session, write_input_files  # noqa: E402
from test_e2e import aggregation, pandas_sessions  # noqa: E402

MASTER = "local-cluster[2,1,1024]"
CONF = "spark.sql.streaming.stateStore.pystatestore."
FILES = 9  # input files, one micro-batch each
# minBatchesToRetain drawn for a retention run: 2-3 of about 9 batches. Run seed 838789598 drew 5
# and its garbage collection deleted nothing while the query ran (at 4 a run deletes about one
# version per store, no margin).
RETAIN_DRAW = (2, 3)
COMMIT_POINTS = [
    "commit:applied",
    "commit:flushed",
    "commit:checkpointed",
    "commit:uploaded",
    "commit:manifest-written",
    # durable first (decision 0032): after the reply, while the worker applies the version
    "apply:written",
    "apply:ingested",
    "apply:checkpointed",
]
APPLY_POINTS = COMMIT_POINTS[-3:]
RESTORE_POINTS = ["restore:file", "restore:replayed", "download:file"]

# Faults inside the state workers, through the fault seam: each draws its rule's details. "after"
# lets the point pass that many times first, so the fault lands at a random commit or restore.
SEAM_FAULTS: dict[str, Callable[[random.Random], dict[str, Any]]] = {
    "worker-exit-mid-commit": lambda r: {"point": r.choice(COMMIT_POINTS), "action": "exit", "after": r.randrange(8)},
    "worker-exit-mid-restore": lambda r: {"point": r.choice(RESTORE_POINTS), "action": "exit", "after": r.randrange(3)},
    "apply-fails": lambda r: {"point": r.choice(APPLY_POINTS), "action": "fail", "after": r.randrange(8), "times": 2},
    "upload-fails": lambda r: {"point": "upload:file", "action": "fail", "after": r.randrange(4), "times": 2},
    "upload-partial": lambda r: {"point": "upload:chunk", "action": "fail", "after": r.randrange(4)},
    "upload-slow": lambda r: {
        "point": "upload:file",
        "action": "sleep",
        "seconds": round(r.uniform(0.5, 3), 2),
        "after": r.randrange(4),
        "times": 3,
    },
    "download-fails": lambda r: {"point": "download:file", "action": "fail", "after": r.randrange(2)},
    "download-partial": lambda r: {"point": "download:chunk", "action": "fail", "after": r.randrange(2)},
    "local-disk-full": lambda r: {"point": "local-save:moved", "action": "enospc", "after": r.randrange(2)},
}
RESTORE_FAULTS = {"worker-exit-mid-restore", "download-fails", "download-partial"}
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
        return f"{self.scenario}/{self.mode}, stops after files {stops}; faults: {'; '.join(parts) or 'none'}"


def draw(seed: int, tag: str) -> Plan:
    rnd = random.Random(seed)
    plan = Plan(
        seed=seed,
        scenario=rnd.choice(sorted(SCENARIOS)),
        mode=rnd.choice(["changelog", "snapshot"]),
        stops=sorted(rnd.sample(range(2, FILES - 1), rnd.randint(0, 2))),
    )
    for fault in rnd.sample(sorted(SEAM_FAULTS) + OTHER_FAULTS, rnd.randint(1, 3)):
        if fault in SEAM_FAULTS:
            rule = {"store": tag, "fault": fault, **SEAM_FAULTS[fault](rnd)}
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
    if not plan.local_recovery:
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


def executor_pids(app_id: str) -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True, check=True).stdout
    return [
        int(line.split(None, 1)[0])
        for line in out.splitlines()
        if "CoarseGrainedExecutorBackend" in line and app_id in line
    ]


def kill_executors(app_id: str, timeout: float = 30) -> int:
    """SIGKILLs the application's executor JVMs, then waits for them and their state workers (which
    exit when the JVM's end of their stdin closes) to be gone, so that nothing of theirs touches the
    local copies after the stop. Returns how many executors it killed."""
    executors = executor_pids(app_id)
    out = subprocess.run(["ps", "-eo", "ppid=,pid="], capture_output=True, text=True, check=True).stdout
    children = [int(pid) for ppid, pid in (line.split() for line in out.splitlines()) if int(ppid) in executors]
    for pid in executors:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    for pid in executors + children:
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    return len(executors)


def damage_local_copies(local_dir: Path, how: str, rnd: random.Random) -> str:
    files = sorted(p for p in local_dir.rglob("*") if p.is_file())
    if not files:
        return "no local copy to damage"
    victim = rnd.choice(files)
    if how == "delete":
        victim.unlink()
    else:
        data = bytearray(victim.read_bytes())
        if data:
            data[rnd.randrange(len(data))] ^= 0x5A
            victim.write_bytes(bytes(data))
    return f"{how} {victim.relative_to(local_dir)}"


def run_query(
    spark: SparkSession, plan: Plan, *, provider: str, run_dir: Path, on_stop: Callable[[], None] | None = None
) -> dict[int, list[tuple]]:
    """The plan's query over FILES input files, stopped and restarted after each of `plan.stops`."""
    build, output_mode = SCENARIOS[plan.scenario]
    input_dir, checkpoint = run_dir / "in", run_dir / "ckpt"
    results: dict[int, list[tuple]] = {}
    bounds = [0, *plan.stops, FILES]
    for start, end in zip(bounds, bounds[1:], strict=False):
        if start > 0 and on_stop is not None:
            on_stop()
        write_input_files(input_dir, start, end - start, seed=plan.seed % 1000)
        run_phase(
            spark,
            build,
            provider=provider,
            input_dir=input_dir,
            checkpoint=checkpoint,
            output_mode=output_mode,
            results=results,
        )
    return results


@dataclass
class CheckReport:
    stores: int = 0
    manifests: int = 0
    files_checked: int = 0  # files and payloads stored inside manifests, checked by the referee
    gc_deleted: int = 0  # versions garbage collection deleted while the query ran (all stores)
    faults_fired: int = 0  # drawn faults that happened (a seam rule fired, an executor was killed)
    unfired: list[str] = field(default_factory=list)  # drawn faults that never happened
    state_diff: str | None = None  # the first difference of the final state from the HDFS run's
    lost: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)


def committed_batches(checkpoint: Path) -> list[int]:
    """The batches Spark's commit log of `checkpoint` still holds."""
    return sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())


def check_checkpoint(checkpoint: Path, work: Path, retain: int) -> CheckReport:
    """Judged by the referee, which shares no code with the product: every version Spark's commit
    log may still ask for is restorable, every file and payload intact; then, after the product's
    garbage collection past the grace (as the query's own maintenance would run it), nothing is
    left that no retained version needs."""
    report = CheckReport()
    batches = committed_batches(checkpoint)
    newest = batches[-1] + 1
    required = [b + 1 for b in batches if b + 1 >= newest - retain]
    later = time.time() + 24 * 3600
    for store in referee.stores_under(checkpoint / "state"):
        report.stores += 1
        present = {int(p.stem) for p in (store / "manifests").glob("*.json") if p.stem.isdigit()}
        report.gc_deleted += sum(1 for v in range(1, max(present, default=0)) if v not in present)
        backend = open_store(store, work / f"check-{report.stores}", retain)
        try:
            backend.maintenance(now=later)
        finally:
            backend.close()
        verdict = referee.judge_store(
            store, min_batches_to_retain=retain, required=required, now=later + 1, in_flight_seconds=0
        )
        report.manifests += len(verdict.versions)
        report.files_checked += verdict.files_checked + verdict.inline_checked
        report.lost += [f"{store}/{p}" for p in verdict.lost]
        report.orphans += [f"{store}/{p}" for p in verdict.orphans]
    return report


def state_rows(spark: SparkSession, checkpoint: Path, batch: int, options: dict[str, str]) -> list[str]:
    reader = spark.read.format("statestore").option("batchId", batch)
    for k, v in options.items():
        reader = reader.option(k, v)
    df = reader.load(str(checkpoint)).select("key", "value", "partition_id")
    return sorted(repr(r.asDict(recursive=True)) for r in df.collect())


def compare_final_state(plan: Plan, reference: Path, ours: Path) -> str | None:
    """The stateful operator's state in our checkpoint against the HDFS run's, read by Spark's
    state data source in a session of its own (no fault seam), at the last batch and two earlier
    retained ones. Returns the first difference, or None."""
    last = committed_batches(reference)[-1]
    if committed_batches(ours)[-1] != last:
        return f"the last committed batch is {committed_batches(ours)[-1]}, the HDFS run's {last}"
    retain = plan.retain if plan.retain is not None else 100
    # Earlier batches both checkpoints still hold: state and offset log (Spark keeps as many entries).
    batches = [
        b
        for b in (last, last - 1, last - 2)
        if b >= max(0, last - retain) and all((c / "offsets" / str(b)).exists() for c in (reference, ours))
    ]
    sides = [{"joinSide": "left"}, {"joinSide": "right"}] if plan.scenario == "stream_join" else [{}]
    spark = start_session("local[2]", app=f"pystatestore-chaos-state-{plan.seed}")
    try:
        for batch in batches:
            for options in sides:
                want = state_rows(spark, reference, batch, options)
                got = state_rows(spark, ours, batch, options)
                if want != got:
                    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
                    return (
                        f"state at batch {batch} {options or ''}: {len(want)} rows in the HDFS run, {len(got)} in "
                        f"ours; e.g. missing {missing[:1]}, unexpected {extra[:1]}"
                    )
    finally:
        spark.stop()
    return None


def first_difference(expected: dict[int, list[tuple]], actual: dict[int, list[tuple]]) -> str | None:
    for batch in sorted(set(expected) | set(actual)):
        want, got = expected.get(batch), actual.get(batch)
        if want == got:
            continue
        if want is None or got is None:
            return f"batch {batch}: {'missing' if got is None else 'unexpected'} in our run"
        for i, (w, g) in enumerate(zip(want, got, strict=False)):
            if w != g:
                return f"batch {batch}, row {i}: HDFS provider {w}, ours {g}"
        return f"batch {batch}: HDFS provider {len(want)} rows, ours {len(got)}"
    return None


def one_run(plan: Plan, run_dir: Path, tag: str) -> tuple[bool, CheckReport, str]:
    run_dir.mkdir(parents=True, exist_ok=True)
    fired_log = run_dir / "faults-fired.txt"
    for i, rule in enumerate(plan.rules):
        rule["record"] = str(fired_log)
        if rule["action"] == "exit":  # once in the run: a replacement worker must not die the same way
            rule["once"] = str(run_dir / f"fault-{i}.fired")
    conf = {
        "spark.executorEnv.PYSTATESTORE_TEST_FAULTS": json.dumps(plan.rules),
        CONF + "commitMode": plan.mode,
        CONF + "localRecoveryDir": str(run_dir / "local"),
        "spark.task.maxFailures": "8",
        "spark.ui.showConsoleProgress": "false",
    }
    if not plan.local_recovery:
        conf[CONF + "localRecovery"] = "false"
    if plan.inline_bytes is not None:
        conf[CONF + "inlineThresholdBytes"] = str(plan.inline_bytes)
    if plan.tiny_grace:
        conf[CONF + "orphanGraceSeconds"] = "10"
        conf["spark.sql.streaming.stateStore.maintenanceInterval"] = "1s"
    if plan.retain is not None:
        # Garbage collection deletes versions while the query runs: few retained, snapshots soon
        # enough to end the old chains, maintenance every second. The HDFS run retains as many.
        conf["spark.sql.streaming.minBatchesToRetain"] = str(plan.retain)
        conf["spark.sql.streaming.stateStore.minDeltasForSnapshot"] = "2"
        conf["spark.sql.streaming.stateStore.maintenanceInterval"] = "1s"
    if plan.local_copy_interval is not None:
        conf[CONF + "localRecoveryInterval"] = str(plan.local_copy_interval)
    spark = start_session(MASTER, app=f"pystatestore-chaos-{plan.seed}", **conf)
    notes: list[str] = []
    try:
        expected = run_query(spark, plan, provider=HDFS_PROVIDER, run_dir=run_dir / "ref")
        app_id = spark.sparkContext.applicationId
        ours = run_dir / tag
        stop = threading.Event()
        rnd = random.Random(plan.seed + 1)

        def killer() -> None:
            for batch in plan.executor_kills:
                while not stop.is_set() and not (ours / "ckpt" / "commits" / str(batch)).exists():
                    time.sleep(0.02)
                if stop.is_set():
                    return
                time.sleep(rnd.uniform(0, 0.5))  # into the next batch, often mid-commit
                pids = executor_pids(app_id)
                if pids:
                    victim = rnd.choice(pids)
                    os.kill(victim, signal.SIGKILL)
                    notes.append(f"killed executor pid {victim} after batch {batch}")

        def between_phases() -> None:
            if plan.cold_stops:
                notes.append(f"killed {kill_executors(app_id)} executors at a stop")
            if plan.local_copy_damage:
                notes.append(damage_local_copies(run_dir / "local", plan.local_copy_damage, rnd))

        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        try:
            actual = run_query(spark, plan, provider=OUR_PROVIDER, run_dir=ours, on_stop=between_phases)
        finally:
            stop.set()
            thread.join(10)
    finally:
        spark.stop()
    fired = fired_log.read_text().splitlines() if fired_log.exists() else []
    unfired: list[str] = []
    for i, rule in enumerate(plan.rules):
        times = sum(1 for line in fired if line.split(" ", 1)[0] == str(i))
        notes.append(f"{rule['fault']} fired {times}x")
        if times == 0:
            unfired.append(f"{rule['fault']} at {rule['point']}")
    kills = sum(1 for n in notes if n.startswith("killed executor pid"))
    if kills < len(plan.executor_kills):
        unfired.append(f"kill-executor ({kills} of {len(plan.executor_kills)} happened)")
    if plan.local_copy_damage and any(n == "no local copy to damage" for n in notes):
        unfired.append(f"local-copy-{plan.local_copy_damage} (no local copy at a stop)")
    retain = plan.retain if plan.retain is not None else 100
    report = check_checkpoint(run_dir / tag / "ckpt", run_dir / "check", retain)
    if plan.retain is not None and report.gc_deleted == 0:
        unfired.append(f"minBatchesToRetain={plan.retain} (garbage collection deleted no version while the query ran)")
    report.unfired = unfired
    report.faults_fired = kills + sum(
        1 for i in range(len(plan.rules)) if any(line.split(" ", 1)[0] == str(i) for line in fired)
    )
    report.state_diff = compare_final_state(plan, run_dir / "ref" / "ckpt", run_dir / tag / "ckpt")
    diff = first_difference(expected, actual)
    if not any(expected.values()):
        diff = "the HDFS run's output is empty: the comparison would prove nothing"
    detail = "; ".join(notes)
    if diff:
        detail = f"{diff}; {detail}" if detail else diff
    return diff is None and report.state_diff is None and not unfired, report, detail


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=None, help="seeds the runs' seeds (default: random)")
    parser.add_argument("--run-seed", type=int, action="append", help="replay exactly this run (repeatable)")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep each run's checkpoints and input")
    args = parser.parse_args()

    if args.run_seed:
        seeds = args.run_seed
    else:
        master_seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
        print(f"chaos: --seed {master_seed}", flush=True)
        rnd = random.Random(master_seed)
        seeds = [rnd.randrange(2**31) for _ in range(args.runs)]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="pss-chaos-"))
    exact = lost = orphans = drawn = fired = state_differs = unfired_runs = retention_runs = 0
    for i, seed in enumerate(seeds, 1):
        tag = f"ours-{seed}"  # the fault rules match this run's stores only
        plan = draw(seed, f"/{tag}/")
        run_dir = workdir / f"run-{seed}"
        shutil.rmtree(run_dir, ignore_errors=True)
        started = time.monotonic()
        try:
            ok, report, detail = one_run(plan, run_dir, tag)
        except Exception as e:  # noqa: BLE001 - a run that fails outright is a failed run, not the end
            ok, report, detail = False, CheckReport(), f"run failed: {type(e).__name__}: {str(e)[:500]}"
            report.state_diff = "not compared (the run failed)"
        ok = ok and not report.lost and not report.orphans
        exact += ok
        drawn += len(plan.rules) + len(plan.executor_kills)
        fired += report.faults_fired
        lost += len(report.lost)
        orphans += len(report.orphans)
        state_differs += report.state_diff is not None
        unfired_runs += bool(report.unfired)
        retention_runs += plan.retain is not None
        verdict = "exact" if ok else "FAILED"
        print(
            f"run {i}/{len(seeds)} seed {seed}: {verdict}, {report.stores} stores, {report.manifests} manifests and "
            f"{report.files_checked} files and payloads checked, {len(report.lost)} lost, {len(report.orphans)} "
            f"orphans, {report.gc_deleted} versions collected while running ({time.monotonic() - started:.0f} s)\n"
            f"  {plan.describe()}" + (f"\n  {detail}" if detail else ""),
            flush=True,
        )
        if report.state_diff:
            print(f"  final state differs: {report.state_diff}", flush=True)
        if report.unfired:
            print(f"  drawn but never fired: {'; '.join(report.unfired)}", flush=True)
        for problem in report.lost[:5] + report.orphans[:5]:
            print(f"  {problem}", flush=True)
        if not ok:
            print(f"  replay: .venv/bin/python scripts/chaos.py --run-seed {seed}", flush=True)
        elif not args.keep:
            shutil.rmtree(run_dir, ignore_errors=True)
    print(
        f"chaos: worker and executor faults: {fired} of {drawn} drawn happened; {retention_runs} of {len(seeds)} "
        f"runs retained {RETAIN_DRAW[0]}-{RETAIN_DRAW[1]} batches; "
        "stops, local-copy damage and tiny graces always happen"
    )
    state = "state equal" if not state_differs else f"state differs in {state_differs}"
    faults = "all drawn faults fired" if not unfired_runs else f"drawn faults never fired in {unfired_runs}"
    print(f"chaos: {exact}/{len(seeds)} runs exact, {state}, {faults}, {lost} files lost, {orphans} orphans left")
    return 0 if exact == len(seeds) else 1


if __name__ == "__main__":
    sys.exit(main())
