"""Runs the JVM contract suite (tests/jvm/Contract*.scala, entry point ContractSuite) and reports each scenario."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from jvm_support import (
    ROOT,
    compile_test_jar,
    minor_test_sources,
    python_path_for_worker,
    run_spark_submit,
    running_minor,
)

# The shared scenarios, then those of what only the running Spark minor's API has (tests/jvm/spark-*/).
CONTRACT_SOURCES = [*sorted((ROOT / "tests" / "jvm").glob("Contract*.scala")), *minor_test_sources(running_minor())]
SCENARIOS = [n for src in CONTRACT_SOURCES for n in re.findall(r'scenario\("([a-z0-9_]+)"\)', src.read_text())]


def foreign_release(root: Path) -> Path:
    """A copy of the installed package that claims to be release 0.1.0 speaking protocol 1."""
    src = Path(python_path_for_worker()) / "pystatestore"
    dst = root / "pystatestore"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "jars"))
    for rel, pattern, replacement in (
        ("worker/service.py", r"^PROTOCOL_VERSION = \d+$", "PROTOCOL_VERSION = 1"),
        ("release.py", r'^__version__ = ".*"$', '__version__ = "0.1.0"'),
    ):
        path = dst / rel
        text, n = re.subn(pattern, replacement, path.read_text(), flags=re.M)
        assert n == 1, f"{path}: no {pattern!r} to rewrite (moved?): the foreign release would not be foreign"
        path.write_text(text)
    return root


# rocksdb: committed versions read through RocksDB views in the JVM, committed as changelogs (the
# default) or as snapshots; memory: the heap near-cache.
ALL_BACKENDS = ["rocksdb", "rocksdb:snapshot", "memory"]
# scripts/test.sh runs the default backend alone on the other Spark minors: what differs between
# minors is the shim's adapter, which every backend goes through alike.
BACKENDS = os.environ.get("PYSTATESTORE_CONTRACT_BACKENDS", " ".join(ALL_BACKENDS)).split()
if unknown := sorted(set(BACKENDS) - set(ALL_BACKENDS)):
    raise ValueError(f"PYSTATESTORE_CONTRACT_BACKENDS: {unknown} not among {ALL_BACKENDS}")


@pytest.fixture(scope="module", params=BACKENDS)
def contract_results(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[str, int]]:
    jar = compile_test_jar("contract", CONTRACT_SOURCES)
    work = tmp_path_factory.mktemp(f"contract-{request.param.replace(':', '-')}")
    stall = [
        {"store": "stuck-store", "point": "commit:uploaded", "action": "sleep", "seconds": 8, "times": 1},
        {"store": "severed-store", "point": "commit:uploaded", "action": "sever", "times": 1},
        {"store": "slow-commit", "point": "commit:uploaded", "action": "sleep", "seconds": 20, "times": 1},
        {"store": "apply-fails", "point": "apply:ingested", "action": "fail", "times": 1},
    ]
    proc = run_spark_submit(
        "org.pystatestore.tests.ContractSuite",
        jar,
        [str(work), sys.executable, python_path_for_worker(), request.param],
        env={
            "PYSTATESTORE_TEST_FAULTS": json.dumps(stall),
            "PYSTATESTORE_TEST_FOREIGN_PYTHONPATH": str(foreign_release(tmp_path_factory.mktemp("foreign"))),
        },
    )
    results = {}
    for line in proc.stdout.splitlines():
        m = re.match(r"^(PASS|FAIL) ([a-z0-9_]+) (\d+)ms(?:: (.*))?$", line)
        if m:
            results[m.group(2)] = (m.group(1) if m.group(1) == "PASS" else f"FAIL: {m.group(4)}", int(m.group(3)))
    if "CONTRACT DONE" not in proc.stdout:
        pytest.fail(
            f"contract suite did not finish (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        )
    show_times(request.config, request.param, results)
    return results


def show_times(config: pytest.Config, backend: str, results: dict[str, tuple[str, int]]) -> None:
    """One line per backend in the test log: where the suite's time goes (issue 83's budget)."""
    slowest = sorted(results.items(), key=lambda item: -item[1][1])[:3]
    line = f"contract[{backend}]: {len(results)} scenarios in {sum(ms for _, ms in results.values()) / 1000:.1f} s; "
    line += "slowest " + ", ".join(f"{name} {ms / 1000:.1f} s" for name, (_, ms) in slowest)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():  # a fixture's output is captured, not shown
            reporter.write_line(line)


@pytest.mark.spark
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_contract(contract_results: dict[str, tuple[str, int]], scenario: str) -> None:
    outcome, ms = contract_results.get(scenario, ("scenario did not run", 0))
    assert outcome == "PASS", f"{outcome} (after {ms} ms)"


def test_every_scenario_is_collected() -> None:
    assert len(SCENARIOS) >= 12, SCENARIOS
    assert len(set(SCENARIOS)) == len(SCENARIOS), "two scenarios share a name"
    assert Path(ROOT / "tests" / "jvm" / "ContractSuite.scala").exists()


@pytest.mark.parametrize("minor", ["4.1", "4.2", "4.3"])
def test_every_minor_has_its_own_scenarios(minor: str) -> None:
    """Each minor's adapter is checked by scenarios of its own API (signatures, maintenance)."""
    names = [n for src in minor_test_sources(minor) for n in re.findall(r'scenario\("([a-z0-9_]+)"\)', src.read_text())]
    assert names, f"no scenarios for Spark {minor}"
    if minor != "4.1":
        assert "force_snapshot_on_commit_has_a_snapshot_when_commit_returns" in names
    if minor == "4.3":
        assert "split_maintenance_snapshots_and_cleans_up_separately" in names
