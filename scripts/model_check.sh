#!/usr/bin/env bash
# The thorough run of the model-based test (tests/test_model.py): 10,000 random histories of 40
# steps (commits, aborts, reloads, maintenance, simulated crashes, a second instance) against a dict
# model, for each state machine (snapshot commits, changelog commits). CI runs 150 histories of 30 steps each.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/setup.sh
PYSTATESTORE_MODEL_PROFILE=thorough exec .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_model.py "$@"
