#!/usr/bin/env bash
# README's test command: sets everything up, then runs lint and the whole test suite (unit,
# model-based, JVM contract, end-to-end on local[2] and local-cluster[2,1,1024], faults, security)
# against the installed wheel. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "test: ruff"
.venv/bin/ruff check python tests scripts setup.py
echo "test: pytest"
export PYSTATESTORE_TEST_INSTALLED=1
exec .venv/bin/python -m pytest -q -p no:cacheprovider -o console_output_style=classic tests "$@"
