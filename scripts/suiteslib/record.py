"""What the child records of each test it runs: one JSON line per outcome, with the first line of
its error, where a Python traceback nested in it ends, its JVM cause, and the checkpoints the test
left (whose provider's files they hold)."""

from __future__ import annotations

import json
import re
import time
import traceback
import unittest
from pathlib import Path
from typing import Any

PY4J_WRAPPER = "py4j.Py4JException: An exception was raised by the Python Proxy"


def checkpoint_providers(tmp: Path) -> dict[str, str]:
    """Every checkpoint (a directory with state/<op>/<part>/) under `tmp`: which provider's files
    its partitions hold ('pystatestore', 'rocksdb', 'both' or 'none')."""
    found: dict[str, str] = {}
    for state in tmp.rglob("state"):
        root = state.parent
        if not state.is_dir() or not ((root / "offsets").is_dir() or (root / "commits").is_dir()):
            continue
        ours = rocks = False
        for part in state.glob("*/*"):
            if not part.is_dir():
                continue
            names = [p.name for p in part.iterdir()]
            ours |= "manifests" in names
            rocks |= any(n.endswith((".zip", ".changelog")) or n == "SSTs" for n in names)
        found[str(root)] = "both" if ours and rocks else "pystatestore" if ours else "rocksdb" if rocks else "none"
    return found


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return f"{type(err).__name__}: {line}" if line else type(err).__name__


def innermost(err: BaseException) -> str:
    return innermost_in_text(str(err))


def innermost_in_text(text: str) -> str:
    """Where the Python traceback nested in an error's text ends (a foreachBatch function's, after
    Py4J's 'Return Message:'), and its last 'SomeError: ...' line; '' if there is none."""
    if "Return Message: " not in text:
        return ""
    text = text.split("Return Message: ", 1)[1]
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n\s+(.+)', text)
    errors = [ln.strip() for ln in text.splitlines() if re.match(r"^\s*[\w.]+(Error|Exception)\b", ln)]
    where = ""
    if frames:
        path, line, func, code = frames[-1]
        where = f"{func} ({path.rsplit('/', 1)[-1]}:{line}): {code.strip()}"
    return " | ".join(x for x in (errors[-1] if errors else "", where) if x)[:500]


def cause_in_text(text: str) -> str:
    """The last 'Caused by: ...' line of an error's text but Py4J's wrapper of a Python error:
    the JVM error that a Python function inside the test (foreachBatch) ran into."""
    caused = re.findall(r"Caused by: ([^\n]+)", text)
    caused = [c for c in caused if not c.startswith(PY4J_WRAPPER)]
    return caused[-1].strip()[:600] if caused else ""


def deepest_cause(err: BaseException) -> str:
    """cause_in_text of the error, else its innermost JVM cause."""
    found = cause_in_text(str(err))
    if found:
        return found
    causes = [c for c in jvm_causes(err)[1:] if not c.startswith(PY4J_WRAPPER)]
    return causes[-1] if causes else ""


def jvm_causes(err: BaseException) -> list[str]:
    """The first line of each cause of a JVM exception PySpark converted (outermost first)."""
    found: list[str] = []
    throwable = getattr(err, "_origin", None)
    while throwable is not None and len(found) < 12:
        try:
            found.append(str(throwable.toString()).strip().splitlines()[0][:600])
            throwable = throwable.getCause()
        except Exception:  # noqa: BLE001 - a gateway gone away: keep what was read
            break
    return found


class Recorder(unittest.TestResult):
    """Writes one JSON line per test outcome, with the checkpoints the test left."""

    def __init__(self, out: Any, tmp: Path) -> None:
        super().__init__()
        self.out, self.tmp = out, tmp
        self.seen: set[str] = set()
        self.started = 0.0

    @staticmethod
    def _name(test: unittest.TestCase) -> str:
        if isinstance(test, unittest.case._SubTest):  # type: ignore[attr-defined]
            test = test.test_case
        if not hasattr(test, "_testMethodName"):  # setUpClass / tearDownClass errors
            desc = str(test)  # "setUpClass (module.Class)"
            m = re.match(r"(\w+) \(([\w.]+)\)", desc)
            return f"{m.group(2).rsplit('.', 1)[-1]}.{m.group(1)}" if m else desc
        return f"{type(test).__name__}.{test._testMethodName}"

    def startTest(self, test: unittest.TestCase) -> None:  # noqa: N802
        super().startTest(test)
        self.started = time.monotonic()
        print(f"pyspark_suites: start {self._name(test)}", flush=True)

    def _write(self, test: unittest.TestCase, status: str, err: Any = None, reason: str = "") -> None:
        seconds = round(time.monotonic() - self.started, 1) if self.started else 0
        record: dict[str, Any] = {"test": self._name(test), "status": status, "seconds": seconds}
        if err is not None:
            exc = err[1]
            record["first_line"] = first_line(exc)[:600]
            record["innermost"] = innermost(exc)
            record["causes"] = jvm_causes(exc)
            record["cause"] = deepest_cause(exc)
            record["traceback"] = "".join(traceback.format_exception(*err))[-20000:]
        if reason:
            record["reason"] = reason
        now = checkpoint_providers(self.tmp)
        record["checkpoints"] = {k: v for k, v in now.items() if k not in self.seen}
        self.seen.update(now)
        self.out.write(json.dumps(record) + "\n")
        self.out.flush()
        print(f"pyspark_suites: {status} {record['test']} {record.get('first_line', '')[:200]}", flush=True)

    def addSuccess(self, test: unittest.TestCase) -> None:  # noqa: N802
        super().addSuccess(test)
        self._write(test, "passed")

    def addFailure(self, test: unittest.TestCase, err: Any) -> None:  # noqa: N802
        super().addFailure(test, err)
        self._write(test, "failed", err)

    def addError(self, test: unittest.TestCase, err: Any) -> None:  # noqa: N802
        super().addError(test, err)
        self._write(test, "error", err)

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:  # noqa: N802
        super().addSkip(test, reason)
        self._write(test, "skipped", reason=reason)

    def addExpectedFailure(self, test: unittest.TestCase, err: Any) -> None:  # noqa: N802
        super().addExpectedFailure(test, err)
        self._write(test, "passed", reason="expected failure")

    def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:  # noqa: N802
        super().addUnexpectedSuccess(test)
        self._write(test, "failed", reason="unexpected success")

    def addSubTest(self, test: unittest.TestCase, subtest: unittest.TestCase, err: Any) -> None:  # noqa: N802
        super().addSubTest(test, subtest, err)
        if err is not None:
            self._write(subtest, "failed" if issubclass(err[0], test.failureException) else "error", err)
