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
import sys
import tempfile
import threading
import time
from pathlib import Path

from chaoslib.checks import CheckReport, check_checkpoint, compare_final_state, first_difference
from chaoslib.faults import executor_pids, kill_executors, run_query
from chaoslib.local_damage import damage_local_copies
from chaoslib.plan import RETAIN_DRAW, Plan, draw
from spark_support import HDFS_PROVIDER, OUR_PROVIDER, start_session

MASTER = "local-cluster[2,1,1024]"
CONF = "spark.sql.streaming.stateStore.pystatestore."


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
        CONF + "durableFirstCommit": str(plan.durable_first).lower(),
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
