#!/usr/bin/env bash
# README's demo command: sets everything up, then runs a real streaming query on pystatestore
# (local Spark, a local checkpoint dir) for a bounded time and prints its progress.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python scripts/demo.py "$@"
