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

# rocksdb: committed versions read through RocksDB views in the JVM, committed as changelogs (the
# default) or as snapshots; memory: the heap near-cache.
ALL_BACKENDS = ["rocksdb", "rocksdb:snapshot", "memory"]
# Each scenario names the backends it runs on (`scenario("name", Reach)`; ContractHarness.scala says
# what each Reach is for): every scenario on the default backend, on the others only those that go
# through what they do differently (issue 83: every behaviour once, not every combination).
REACH = {
    "EveryBackend": ALL_BACKENDS,
    "BothCommitModes": ["rocksdb", "rocksdb:snapshot"],
    "DefaultBackendOnly": ["rocksdb"],
}
SCENARIO_CALL = re.compile(r'\bscenario\("([a-z0-9_]+)", (\w+)\)')


def scenarios_in(sources: list[Path]) -> list[tuple[str, str]]:
    """(name, reach) of each `scenario(...)` call in `sources`."""
    return [(m[1], m[2]) for src in sources for m in SCENARIO_CALL.finditer(src.read_text())]


SCENARIOS = dict(scenarios_in(CONTRACT_SOURCES))
# scripts/test.sh runs the default backend alone on the other Spark minors: what differs between
# minors is the shim's adapter, which every backend goes through alike.
BACKENDS = os.environ.get("PYSTATESTORE_CONTRACT_BACKENDS", " ".join(ALL_BACKENDS)).split()
if unknown := sorted(set(BACKENDS) - set(ALL_BACKENDS)):
    raise ValueError(f"PYSTATESTORE_CONTRACT_BACKENDS: {unknown} not among {ALL_BACKENDS}")
RUNS = [(backend, name) for backend in BACKENDS for name, reach in SCENARIOS.items() if backend in REACH.get(reach, [])]


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


@pytest.fixture(scope="module")
def contract_results(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[tuple[str, str], tuple[str, int]]:
    """(backend, scenario) -> ("PASS" or "FAIL: why", milliseconds), from one spark-submit that runs
    every backend in turn: one JVM's start-up rather than one per backend."""
    jar = compile_test_jar("contract", CONTRACT_SOURCES)
    work = tmp_path_factory.mktemp("contract")
    # Each fires once per worker; every backend's scenarios start with workers of their own.
    faults = [
        {"store": "stuck-store", "point": "commit:uploaded", "action": "sleep", "seconds": 8, "times": 1},
        {"store": "severed-store", "point": "commit:uploaded", "action": "sever", "times": 1},
        # Longer than the smallest orphan grace (10 s) by enough for GC runs past it.
        {"store": "slow-commit", "point": "commit:uploaded", "action": "sleep", "seconds": 14, "times": 1},
        {"store": "apply-fails", "point": "apply:ingested", "action": "fail", "times": 1},
    ]
    proc = run_spark_submit(
        "org.pystatestore.tests.ContractSuite",
        jar,
        [str(work), sys.executable, python_path_for_worker(), ",".join(BACKENDS)],
        env={
            "PYSTATESTORE_TEST_FAULTS": json.dumps(faults),
            "PYSTATESTORE_TEST_FOREIGN_PYTHONPATH": str(foreign_release(tmp_path_factory.mktemp("foreign"))),
        },
    )
    results = {}
    for line in proc.stdout.splitlines():
        m = re.match(r"^(PASS|FAIL) (\S+) ([a-z0-9_]+) (\d+)ms(?:: (.*))?$", line)
        if m:
            outcome = "PASS" if m[1] == "PASS" else f"FAIL: {m[5]}"
            results[(m[2], m[3])] = (outcome, int(m[4]))
    if "CONTRACT DONE" not in proc.stdout:
        pytest.fail(
            f"contract suite did not finish (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        )
    show_times(request.config, results)
    return results


def show_times(config: pytest.Config, results: dict[tuple[str, str], tuple[str, int]]) -> None:
    """One line per backend in the test log: where the suite's time goes (issue 83's budget)."""
    lines = []
    for backend in BACKENDS:
        times = {name: ms for (b, name), (_, ms) in results.items() if b == backend}
        slowest = sorted(times.items(), key=lambda item: -item[1])[:3]
        lines.append(
            f"contract[{backend}]: {len(times)} scenarios in {sum(times.values()) / 1000:.1f} s; slowest "
            + ", ".join(f"{name} {ms / 1000:.1f} s" for name, ms in slowest)
        )
    # Under pytest-xdist a worker has no terminal: the lines go to the test command's results instead.
    results_dir = os.environ.get("PYSTATESTORE_TEST_RESULTS")
    if results_dir:
        minor = os.environ.get("PYSTATESTORE_EXPECT_SPARK_MINOR", "default")
        with open(Path(results_dir) / f"contract-times-spark-{minor}.txt", "w") as out:
            out.writelines(line + "\n" for line in lines)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():  # a fixture's output is captured, not shown
            for line in lines:
                reporter.write_line(line)


@pytest.mark.spark
@pytest.mark.parametrize(("backend", "scenario"), RUNS, ids=[f"{backend}-{name}" for backend, name in RUNS])
def test_contract(contract_results: dict[tuple[str, str], tuple[str, int]], backend: str, scenario: str) -> None:
    outcome, ms = contract_results.get((backend, scenario), ("scenario did not run", 0))
    assert outcome == "PASS", f"{outcome} (after {ms} ms)"


@pytest.mark.spark
def test_each_backend_ran_the_scenarios_its_reach_names(
    contract_results: dict[tuple[str, str], tuple[str, int]],
) -> None:
    """The suite (ContractHarness's Reach) and this file (REACH) agree on what runs where."""
    assert sorted(contract_results) == sorted(RUNS)


def every_minors_sources() -> list[Path]:
    minors = [*sorted((ROOT / "tests" / "jvm").glob("Contract*.scala"))]
    for minor in ["4.1", "4.2", "4.3"]:
        minors += [src for src in minor_test_sources(minor) if src not in minors]
    return minors


def test_every_scenario_names_the_backends_it_runs_on() -> None:
    """A new scenario is placed deliberately: its call names a Reach (scalac insists on one) that
    REACH knows, in a form this file reads; and REACH knows the harness's every Reach."""
    sources = every_minors_sources()
    for src in sources:
        text = src.read_text()
        calls = re.findall(r"(?<!def )\bscenario\(", text)
        assert len(calls) == len(SCENARIO_CALL.findall(text)), (
            f'{src}: a scenario call not written as scenario("name", Reach)'
        )
    scenarios = scenarios_in(sources)
    names = [name for name, _ in scenarios]
    assert len(names) >= 12, names
    assert len(set(names)) == len(names), "two scenarios share a name"
    assert {reach for _, reach in scenarios} <= set(REACH), scenarios
    harness = (ROOT / "tests" / "jvm" / "ContractHarness.scala").read_text()
    assert set(re.findall(r"case object (\w+) extends Reach", harness)) == set(REACH)
    assert all("rocksdb" in backends and set(backends) <= set(ALL_BACKENDS) for backends in REACH.values())
    assert (ROOT / "tests" / "jvm" / "ContractSuite.scala").exists()


@pytest.mark.parametrize("minor", ["4.1", "4.2", "4.3"])
def test_every_minor_has_its_own_scenarios(minor: str) -> None:
    """Each minor's adapter is checked by scenarios of its own API (signatures, maintenance)."""
    names = [name for name, _ in scenarios_in(minor_test_sources(minor))]
    assert names, f"no scenarios for Spark {minor}"
    if minor != "4.1":
        assert "force_snapshot_on_commit_has_a_snapshot_when_commit_returns" in names
    if minor == "4.3":
        assert "split_maintenance_snapshots_and_cleans_up_separately" in names
