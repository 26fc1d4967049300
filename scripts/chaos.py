"""Fault matrix (issue 11): seeded random runs of stateful queries on `local-cluster[2,1,1024]` with
faults injected, each compared row for row with Spark's HDFS provider on the same input and the
same stops, then the checkpoint checked: every file of every retained manifest exists with its size
and checksum, and after garbage collection past the grace nothing unreferenced remains.

    .venv/bin/python scripts/chaos.py [--runs 5] [--seed S] [--run-seed X] [--workdir DIR] [--keep]

Each run draws from its own seed (printed; `--run-seed X` replays exactly that run's draw): a
query (aggregation in update mode, dropDuplicates with a watermark, applyInPandasWithState with
event-time timeouts, a stream-stream join), a commit mode, where the query stops and restarts, and
faults from the menu below. Faults inside the state workers go through the test-only fault seam
(`PYSTATESTORE_TEST_FAULTS`, set on the executors of the run's own application, never by a conf);
executor kills are SIGKILLs of the run's own executor JVMs. A failing run prints its seed, its
faults, and the first differing batch. The last line reads
`chaos: N/N runs exact, 0 files lost, 0 orphans left`.
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

from backend_support import open_store  # noqa: E402
from pystatestore.store.manifest import Manifest, checksum  # noqa: E402
from pystatestore.store.retention import DATA_DIRS  # noqa: E402
from spark_support import HDFS_PROVIDER, OUR_PROVIDER, run_phase, start_session, write_input_files  # noqa: E402
from test_e2e import aggregation, pandas_sessions  # noqa: E402

MASTER = "local-cluster[2,1,1024]"
CONF = "spark.sql.streaming.stateStore.pystatestore."
FILES = 9  # input files, one micro-batch each
COMMIT_POINTS = [
    "commit:applied",
    "commit:flushed",
    "commit:checkpointed",
    "commit:uploaded",
    "commit:manifest-written",
]
RESTORE_POINTS = ["restore:file", "restore:replayed", "download:file"]

# Faults inside the state workers, through the fault seam: each draws its rule's details. "after"
# lets the point pass that many times first, so the fault lands at a random commit or restore.
SEAM_FAULTS: dict[str, Callable[[random.Random], dict[str, Any]]] = {
    "worker-exit-mid-commit": lambda r: {"point": r.choice(COMMIT_POINTS), "action": "exit", "after": r.randrange(8)},
    "worker-exit-mid-restore": lambda r: {"point": r.choice(RESTORE_POINTS), "action": "exit", "after": r.randrange(3)},
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

    def describe(self) -> str:
        parts = [f"{r['fault']} ({r['action']} at {r['point']}, after {r.get('after', 0)})" for r in self.rules]
        parts += [f"kill-executor@batch{b}" for b in self.executor_kills]
        if self.local_copy_damage:
            parts.append(f"local-copy-{self.local_copy_damage}@stops")
        if not self.local_recovery:
            parts.append("no local recovery")
        if self.tiny_grace:
            parts.append("maintenance-grace-10s")
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
    return plan


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
    files_checked: int = 0
    faults_fired: int = 0  # drawn faults that happened (a seam rule fired, an executor was killed)
    lost: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)


def check_checkpoint(checkpoint: Path, work: Path) -> CheckReport:
    """Every retained manifest's files exist with their size and checksum; after maintenance past
    the grace, every data file is one a retained version needs."""
    report = CheckReport()
    for manifests in sorted((checkpoint / "state").rglob("manifests")):
        store = manifests.parent
        report.stores += 1
        backend = open_store(store, work / f"check-{report.stores}")
        try:
            backend.maintenance(now=time.time() + 24 * 3600)
            remote = backend.remote
            listed = remote.list_files("manifests")
            data = [f for d in DATA_DIRS for f in remote.list_files(d.rstrip("/"))]
            needs = backend.needs_by_version(listed, data, now=time.time() + 24 * 3600)
            needed = {p for refs in needs.values() for p in refs or ()}
            report.orphans += [f"{store}/{f.path}" for f in data if f.path not in needed]
            for mf in listed:
                if not mf.path.endswith(".json") or "/." in mf.path:
                    continue
                m = Manifest.from_json(
                    (store / mf.path).read_bytes(), store=str(store), version=int(Path(mf.path).stem), file=mf.path
                )
                report.manifests += 1
                for ref in m.files():
                    path = store / ref.path
                    report.files_checked += 1
                    if not path.is_file():
                        report.lost.append(f"{store}/{ref.path} (missing; version {m.version})")
                        continue
                    body = path.read_bytes()
                    if len(body) != ref.size or checksum(body) != ref.checksum:
                        report.lost.append(f"{store}/{ref.path} (size or checksum differs; version {m.version})")
        finally:
            backend.close()
    return report


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
    for i, rule in enumerate(plan.rules):
        times = sum(1 for line in fired if line.split(" ", 1)[0] == str(i))
        notes.append(f"{rule['fault']} fired {times}x")
    report = check_checkpoint(run_dir / tag / "ckpt", run_dir / "check")
    report.faults_fired = sum(1 for n in notes if n.startswith("killed executor")) + sum(
        1 for i in range(len(plan.rules)) if any(line.split(" ", 1)[0] == str(i) for line in fired)
    )
    diff = first_difference(expected, actual)
    detail = "; ".join(notes)
    if diff:
        detail = f"{diff}; {detail}" if detail else diff
    return diff is None, report, detail


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
    exact = lost = orphans = drawn = fired = 0
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
        exact += ok
        drawn += len(plan.rules) + len(plan.executor_kills)
        fired += report.faults_fired
        lost += len(report.lost)
        orphans += len(report.orphans)
        verdict = "exact" if ok else "DIFFERS"
        print(
            f"run {i}/{len(seeds)} seed {seed}: {verdict}, {report.stores} stores, {report.manifests} manifests and "
            f"{report.files_checked} files "
            f"checked, {len(report.lost)} lost, {len(report.orphans)} orphans ({time.monotonic() - started:.0f} s)\n"
            f"  {plan.describe()}" + (f"\n  {detail}" if detail else ""),
            flush=True,
        )
        for problem in report.lost[:5] + report.orphans[:5]:
            print(f"  {problem}", flush=True)
        if not ok or report.lost or report.orphans:
            print(f"  replay: .venv/bin/python scripts/chaos.py --run-seed {seed}", flush=True)
        if not args.keep and ok and not report.lost and not report.orphans:
            shutil.rmtree(run_dir, ignore_errors=True)
    print(
        f"chaos: worker and executor faults: {fired} of {drawn} drawn happened (a fault at a restore or "
        "upload needs one to happen); stops, local-copy damage and tiny graces always do"
    )
    print(f"chaos: {exact}/{len(seeds)} runs exact, {lost} files lost, {orphans} orphans left")
    return 0 if exact == len(seeds) and not lost and not orphans else 1


if __name__ == "__main__":
    sys.exit(main())
