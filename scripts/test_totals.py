"""Totals the pytest runs of the test command (one JUnit XML per Spark minor) into one line."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET


def main(paths: list[str]) -> int:
    totals = {"passed": 0, "failed": 0, "skipped": 0}
    for path in paths:
        suite = ET.parse(path).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        tests, failed = int(suite.get("tests", 0)), int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        skipped = int(suite.get("skipped", 0))
        totals["failed"] += failed
        totals["skipped"] += skipped
        totals["passed"] += tests - failed - skipped
        print(f"test: {path}: {tests - failed - skipped} passed, {failed} failed, {skipped} skipped")
    print(f"{totals['passed']} passed, {totals['failed']} failed, {totals['skipped']} skipped")
    return 1 if totals["failed"] or not paths else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
