"""What the benchmarks share (scripts/benchlib) and the soak's report (scripts/soaklib): the order
providers run in, medians with ranges, a child's options, the run's CPU counted across a process's
end, and the committed soak reports rendered again from their raw figures. No Spark."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from benchlib.child import script_argv  # noqa: E402 - scripts/ is no installed package
from benchlib.procfs import CLOCK_TICKS, RunTicks, subtree  # noqa: E402
from benchlib.repeats import medians_over, range_text, rotation, spread_rotation  # noqa: E402
from benchlib.samplers import CpuLoad  # noqa: E402
from soaklib.report import report_lines  # noqa: E402


def test_rotations_start_each_name_early_and_late() -> None:
    names = ["a", "b", "c", "d", "e"]
    assert [rotation(names, i)[0] for i in range(3)] == ["a", "b", "c"]
    # bench.py's: the starts spread over the list (5 runs, 3 repeats: 0, 1, 3)
    assert [spread_rotation(names, i, 3)[0] for i in range(3)] == ["a", "b", "d"]
    assert sorted(spread_rotation(names, 2, 3)) == names


def test_medians_over_repeats_keep_their_ranges() -> None:
    runs = [{"batch_ms": 10, "name": "x"}, {"batch_ms": 30, "name": "x"}, {"batch_ms": 20, "name": "x"}]
    figures = medians_over(runs)
    assert figures["batch_ms"] == 20 and figures["batch_ms_range"] == (10, 30) and "name" not in figures
    assert range_text(figures, "batch_ms", ".0f") == "10-30"
    assert range_text(medians_over(runs[:1]), "batch_ms", ".0f") == "-"


def test_a_childs_options_parse_back_as_given() -> None:
    argv = script_argv("x.py", child="pss", driver_java_options="-Xms1g -Xlog:gc", conf=["a=1", "b=2"], flag=True)
    assert argv[0] == "x.py" and "--off" not in script_argv("x.py", off=False, none=None)
    ap = argparse.ArgumentParser()
    for flag in ("--child", "--driver-java-options"):
        ap.add_argument(flag)
    ap.add_argument("--conf", action="append")
    ap.add_argument("--flag", action="store_true")
    args = ap.parse_args(argv[1:])
    assert (args.child, args.driver_java_options, args.conf, args.flag) == (
        "pss",
        "-Xms1g -Xlog:gc",
        ["a=1", "b=2"],
        True,
    )


BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass"


def test_the_runs_cpu_counts_a_child_across_its_end() -> None:
    """A process that ends takes nothing back from the run (a sum over the live tree dropped by all
    it had used, which the load reading then called other work's), and one reaped by a process of
    the run keeps its last ticks, through its parent's count of reaped children."""
    child = subprocess.Popen([sys.executable, "-c", BURN])
    only_child, whole = RunTicks(), RunTicks()
    only_child.since_last([child.pid])
    whole.since_last(subtree(os.getpid()))
    time.sleep(0.2)
    assert only_child.since_last([child.pid]) > 0  # counted while it runs
    seen = whole.since_last(subtree(os.getpid()))
    child.wait()
    assert only_child.since_last([child.pid]) >= 0
    after = whole.since_last(subtree(os.getpid()))
    assert (seen + after) / CLOCK_TICKS >= 0.45


def test_the_load_reading_starts_unknown() -> None:
    load = CpuLoad()
    assert all(math.isnan(x) for x in load.read([os.getpid()]))
    other, own = load.read([os.getpid()])
    assert other >= 0 and own >= 0


@pytest.mark.parametrize("minor", ["4.1", "4.2", "4.3"])
def test_the_committed_soak_reports_render_again_from_their_raw_figures(minor: str) -> None:
    raws = json.loads((ROOT / "bench" / f"soak-200-partitions-spark{minor}.json").read_text())
    raws.pop("meta", None)
    committed = (ROOT / "bench" / f"soak-200-partitions-spark{minor}.txt").read_text().splitlines()
    body = committed[committed.index("") + 1 :]  # after the header
    assert "\n".join(report_lines(raws, 200)).rstrip() == "\n".join(body).rstrip()
