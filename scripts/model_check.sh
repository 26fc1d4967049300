#!/usr/bin/env bash
# The thorough run of the model-based test (tests/test_model.py): 10,000 random histories of
# commits, aborts, reloads, maintenance and simulated crashes against a dict model. CI runs 1,000.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/setup.sh
PYSTATESTORE_MODEL_PROFILE=thorough exec .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_model.py "$@"
