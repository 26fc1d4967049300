"""The fault matrix (scripts/chaos.py) on fixed seeds: between them they draw executor SIGKILLs, a
worker dying mid-commit and mid-restore, a slow upload, a deleted local copy, a partial download, a
tiny GC grace and small retention. Every drawn fault must fire, the output and the final state must
equal the HDFS provider's, and the independent referee must find nothing lost or left (the 50-run
output with random seeds is under bench/)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# slow (4 minutes): scripts/test.sh leaves it out; `bash scripts/test.sh -m ""` runs it. The fault
# cases themselves run in every test command through test_faults, test_reliability and
# test_local_recovery_spark.
pytestmark = [pytest.mark.spark, pytest.mark.slow]
ROOT = Path(__file__).resolve().parent.parent
# dedup + executor kill + worker exit mid-restore + slow upload + retention 3; applyInPandasWithState +
# executor kills + local copy deleted; join + partial download + worker exit mid-commit + tiny grace +
# retention 2. Since the apply faults joined the menu (6182bb9) the earlier seeds 53, 105, 103 drew
# neither a partial download nor a deleted local copy, and this test failed on what it asserts.
SEEDS = [13404, 1076, 13344]


def test_fixed_seeds_are_exact_with_nothing_lost_or_left(tmp_path: Path) -> None:
    env = dict(os.environ)
    if env.get("PYSTATESTORE_TEST_INSTALLED") != "1":
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "python"), env.get("PYTHONPATH")]))
    args = [sys.executable, str(ROOT / "scripts" / "chaos.py"), "--workdir", str(tmp_path)]
    for seed in SEEDS:
        args += ["--run-seed", str(seed)]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith(("run ", "  ", "chaos:"))]
    report = "\n".join(lines)
    assert done.returncode == 0, report + "\n" + done.stderr[-3000:]
    n = len(SEEDS)
    assert lines[-1] == (
        f"chaos: {n}/{n} runs exact, state equal, all drawn faults fired, 0 files lost, 0 orphans left"
    ), report
    # each drawn fault fired (chaos fails a run otherwise; these say so in the report itself)
    for fault in ("worker-exit-mid-restore", "upload-slow", "download-partial", "worker-exit-mid-commit"):
        assert f"{fault} fired 0x" not in report and f"{fault} fired" in report, (fault, report)
    assert report.count("killed executor pid") >= 3, report
    assert "delete " in report and "no local copy to damage" not in report, report
    assert "drawn but never fired" not in report, report
