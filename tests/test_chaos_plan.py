"""The fault matrix draws only faults that can fire (scripts/chaoslib/plan.py): a drawn fault that
never fires fails a chaos run, so a draw that cannot fire is a harness bug found an hour in. Checked
over many seeds against what the run does (scripts/chaos.py, chaoslib/faults.py): stops after file
s end a phase whose last batch is s - 1 and, when cold, kill every executor; a full local disk at
local-save leaves no local copy to restore from."""

from __future__ import annotations

import sys
from itertools import pairwise
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from chaoslib.plan import FILES, draw  # noqa: E402

SEEDS = range(4000)


def test_no_executor_kill_is_drawn_where_a_stop_already_killed_every_executor() -> None:
    drawn = 0
    for seed in SEEDS:
        plan = draw(seed, "/pss/")
        drawn += len(plan.executor_kills)
        assert all(1 <= b < FILES - 1 for b in plan.executor_kills), (seed, plan.executor_kills)
        if plan.cold_stops:
            last_batches = {stop - 1 for stop in plan.stops}
            assert not set(plan.executor_kills) & last_batches, (seed, plan.executor_kills, plan.stops)
    assert drawn > 100  # the draw still kills executors


def test_no_local_restore_fault_is_drawn_beside_local_saves_that_fail() -> None:
    for seed in [*SEEDS, 2116397989]:
        plan = draw(seed, "/pss/")
        if any(r["point"] == "local-save:moved" and r["action"] == "enospc" for r in plan.rules):
            assert not any(r["point"] == "restore:file" for r in plan.rules), (seed, plan.rules)


def test_a_commit_fault_waits_fewer_commits_than_one_store_makes_in_a_worker_life() -> None:
    """A worker process may hold one store only (pool of one per one-core executor, stores spread
    over executors), and it lives from one kill of its executor to the next: a stop that kills
    every executor (cold), or an executor kill after batch b (file b + 1). In that stretch its store
    commits at least once per input file."""
    capped = 0
    for seed in [*SEEDS, 657555479]:
        plan = draw(seed, "/pss/")
        kills = sorted({*(b + 1 for b in plan.executor_kills), *(plan.stops if plan.cold_stops else [])})
        lives = [end - start for start, end in pairwise([0, *kills, FILES])]
        for rule in plan.rules:
            if rule["point"].startswith(("commit:", "apply:")):
                assert rule["after"] < max(lives), (seed, rule, plan.stops, plan.executor_kills)
                capped += rule["after"] == max(lives) - 1
    assert capped > 10  # the draw still reaches the last commit a worker makes
