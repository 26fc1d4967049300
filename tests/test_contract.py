"""Runs the JVM contract suite (tests/jvm/ContractSuite.scala) once and reports each scenario."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from jvm_support import ROOT, compile_test_jar, python_path_for_worker, run_spark_submit

SCENARIOS = re.findall(r'scenario\("([a-z0-9_]+)"\)', (ROOT / "tests" / "jvm" / "ContractSuite.scala").read_text())


def foreign_release(root: Path) -> Path:
    """A copy of the installed package that claims to be release 0.1.0 speaking protocol 1."""
    src = Path(python_path_for_worker()) / "pystatestore"
    dst = root / "pystatestore"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "jars"))
    service = dst / "service.py"
    service.write_text(re.sub(r"^PROTOCOL_VERSION = \d+$", "PROTOCOL_VERSION = 1", service.read_text(), flags=re.M))
    init = dst / "__init__.py"
    init.write_text(re.sub(r'^__version__ = ".*"$', '__version__ = "0.1.0"', init.read_text(), flags=re.M))
    return root


# rocksdb: committed versions read through RocksDB views in the JVM, committed as changelogs (the
# default) or as snapshots; memory: the heap near-cache.
BACKENDS = ["rocksdb", "rocksdb:snapshot", "memory"]


@pytest.fixture(scope="module", params=BACKENDS)
def contract_results(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    jar = compile_test_jar("contract", [ROOT / "tests" / "jvm" / "ContractSuite.scala"])
    work = tmp_path_factory.mktemp(f"contract-{request.param.replace(':', '-')}")
    stall = [
        {"store": "stuck-store", "point": "commit:uploaded", "action": "sleep", "seconds": 8, "times": 1},
        {"store": "severed-store", "point": "commit:uploaded", "action": "sever", "times": 1},
        {"store": "slow-commit", "point": "commit:uploaded", "action": "sleep", "seconds": 13, "times": 1},
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
        m = re.match(r"^(PASS|FAIL) ([a-z0-9_]+)(?:: (.*))?$", line)
        if m:
            results[m.group(2)] = m.group(1) if m.group(1) == "PASS" else f"FAIL: {m.group(3)}"
    if "CONTRACT DONE" not in proc.stdout:
        pytest.fail(
            f"contract suite did not finish (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        )
    return results


@pytest.mark.spark
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_contract(contract_results: dict[str, str], scenario: str) -> None:
    assert contract_results.get(scenario) == "PASS", contract_results.get(scenario, "scenario did not run")


def test_every_scenario_is_collected() -> None:
    assert len(SCENARIOS) >= 12, SCENARIOS
    assert Path(ROOT / "tests" / "jvm" / "ContractSuite.scala").exists()
