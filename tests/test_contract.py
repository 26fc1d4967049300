"""Runs the JVM contract suite (tests/jvm/ContractSuite.scala) once and reports each scenario."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from jvm_support import ROOT, compile_test_jar, python_path_for_worker, run_spark_submit

SCENARIOS = re.findall(r'scenario\("([a-z0-9_]+)"\)', (ROOT / "tests" / "jvm" / "ContractSuite.scala").read_text())


@pytest.fixture(scope="module")
def contract_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    jar = compile_test_jar("contract", [ROOT / "tests" / "jvm" / "ContractSuite.scala"])
    work = tmp_path_factory.mktemp("contract")
    proc = run_spark_submit(
        "org.pystatestore.tests.ContractSuite", jar, [str(work), sys.executable, python_path_for_worker()]
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
