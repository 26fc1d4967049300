#!/usr/bin/env bash
# The thorough run of the model-based test (tests/test_model.py): 10,000 random histories of up to
# 40 steps (commits, aborts, reloads, maintenance, simulated crashes, a second instance) against a
# dict model, for each state machine (snapshot commits, changelog commits, changelog commits with
# compaction). CI runs 150 histories of 30 steps each. Well over an hour of CPU per state machine
# (the changelog machines ran 117 min at two thirds of a core each without finishing, on a 2-core
# machine with MODEL_JOBS=3), so give it an otherwise idle machine. The machines run side by side,
# as many at once as there are cores (MODEL_JOBS overrides), each with its own log under
# .test-results/model-check/; pytest's per-test timeout is off here.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/setup.sh
logs=.test-results/model-check
mkdir -p "$logs"
jobs=${MODEL_JOBS:-$(nproc)}
machines=(TestSnapshotModel TestChangelogModel TestCompactChangelogModel test_the_model_configuration_compacts)
status=0
running=0
for m in "${machines[@]}"; do
  if [ "$running" -ge "$jobs" ]; then
    wait -n || status=1
    running=$((running - 1))
  fi
  echo "model_check: $m (log: $logs/$m.log)"
  PYSTATESTORE_MODEL_PROFILE=${PYSTATESTORE_MODEL_PROFILE:-thorough} .venv/bin/python -m pytest -q -p no:cacheprovider -o timeout=0 \
    --hypothesis-show-statistics "tests/test_model.py::$m" "$@" > "$logs/$m.log" 2>&1 &
  running=$((running + 1))
done
while [ "$running" -gt 0 ]; do
  wait -n || status=1
  running=$((running - 1))
done
for m in "${machines[@]}"; do
  echo "model_check: $m: $(grep -E '^[0-9]+ (passed|failed)|passed|failed' "$logs/$m.log" | tail -1)"
  grep -E "[0-9]+ passing, [0-9]+ failing" "$logs/$m.log" | sed "s/^ */    /" || true
done
[ "$status" -eq 0 ] && echo "model_check: every state machine passed" || echo "model_check: FAILED (logs above)"
exit $status
