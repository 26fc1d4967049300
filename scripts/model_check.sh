#!/usr/bin/env bash
# The thorough run of the model-based test (tests/test_model.py): 10,000 random histories of up to
# 40 steps (commits, aborts, reloads, maintenance, simulated crashes, a second instance) against a
# dict model, for each state machine (snapshot commits, changelog commits, changelog commits with
# compaction). The test command runs 40 histories of 30 steps each.
#
# It takes hours (since crashes are real worker deaths, 1,170-1,510 s a chunk two at a time in the
# last run on 2 cores: about 5 hours), more than one working session, so it runs in seeded chunks
# of MODEL_CHUNK histories (default 1,000; chunk k uses Hypothesis seed k) and is resumable: each
# finished chunk appends a line to the ledger, bench/model-check-thorough.txt, with the fingerprint
# of the code under test (the store layer, the leaf modules and the model test), and a later run
# skips the chunks that already passed on the same code. A change to that code starts the count
# again; a chunk during which it changed is not recorded. Chunks run MODEL_JOBS at a time (default: the cores), one log
# each under .test-results/model-check/; pytest's per-test timeout is off here.
#
#   bash scripts/model_check.sh            run the chunks still missing, then print the tally
#   bash scripts/model_check.sh --status   print the tally only
#   touch .test-results/model-check/STOP   start no new chunk (the running ones finish and count);
#                                          the next run removes it
#
# A chunk whose pytest was ended by a signal (a machine needed for something else) is neither
# passed nor failed: it is not recorded, and runs again next time.
#
# Exit 0 only when every state machine has all its histories passed on the current code.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/setup.sh
logs=.test-results/model-check
ledger=${MODEL_LEDGER:-bench/model-check-thorough.txt}
mkdir -p "$logs"
jobs=${MODEL_JOBS:-$(nproc)}
chunk=${MODEL_CHUNK:-1000}
histories=${MODEL_HISTORIES:-10000}
chunks=$(( (histories + chunk - 1) / chunk ))
machines=(TestSnapshotModel TestChangelogModel TestCompactChangelogModel)
# What a passing chunk vouches for: the code the model test runs (the store layer and the leaf
# modules it may import, tests/test_layering.py) and the model test with its helpers. The worker,
# the tools and the JVM shim are not under this test: changing them keeps the count.
fingerprint() {
  find python/pystatestore/store python/pystatestore/release.py python/pystatestore/spark_minors.py \
    tests/test_model.py tests/backend_support.py -name '*.py' -type f | LC_ALL=C sort |
    xargs sha256sum | sha256sum | cut -c1-12
}
code=$(fingerprint)
touch "$ledger"

passed_chunk() {  # machine, chunk index: passed on this code?
  grep -qE "^$1 chunk $2/$chunks seed $2 histories $chunk steps 40 code $code: passed" "$ledger"
}

tally() {
  local complete=1
  for m in "${machines[@]}"; do
    local done_=0
    for k in $(seq 1 "$chunks"); do passed_chunk "$m" "$k" && done_=$((done_ + 1)); done
    local n=$((done_ * chunk)); [ "$n" -gt "$histories" ] && n=$histories
    echo "model_check: $m: $n of $histories histories passed on code $code ($done_ of $chunks chunks)"
    [ "$done_" -eq "$chunks" ] || complete=0
  done
  if grep -qE "code $code: FAILED" "$ledger"; then
    echo "model_check: FAILED on this code:"; grep -E "code $code: FAILED" "$ledger" | sed "s/^/    /"
    return 1
  fi
  [ "$complete" -eq 1 ] && echo "model_check: every state machine passed $histories histories" && return 0
  echo "model_check: not complete yet: run it again to resume"
  return 1
}

if [ "${1:-}" = "--status" ]; then tally; exit $?; fi

run_chunk() {  # machine, chunk index
  local m=$1 k=$2 log="$logs/$1-chunk$2.log" start=$SECONDS
  if [ "$(fingerprint)" != "$code" ]; then  # a chunk tests the files as they are when it starts
    echo "model_check: the code under test changed since this run started: run it again" >&2
    return 1
  fi
  local rc=0
  PYSTATESTORE_MODEL_PROFILE=thorough PYSTATESTORE_MODEL_EXAMPLES=$chunk .venv/bin/python -m pytest -q \
    -p no:cacheprovider -o timeout=0 --hypothesis-seed="$k" --hypothesis-show-statistics \
    "tests/test_model.py::$m" > "$log" 2>&1 || rc=$?
  if [ "$rc" -gt 128 ] || ! grep -qE '(passed|failed|error)' "$log"; then  # killed, not judged
    echo "model_check: $m chunk $k/$chunks: interrupted (exit $rc); not recorded" >&2
    return 1
  fi
  if [ "$rc" -eq 0 ]; then
    result="passed ($(grep -oE '[0-9]+ passing, [0-9]+ failing, and [0-9]+ invalid' "$log" | head -1))"
  else
    result="FAILED (log: $log; replay: PYSTATESTORE_MODEL_PROFILE=thorough PYSTATESTORE_MODEL_EXAMPLES=$chunk"
    result+=" .venv/bin/python -m pytest --hypothesis-seed=$k tests/test_model.py::$m)"
  fi
  if [ "$(fingerprint)" != "$code" ]; then  # edited while it ran: the result vouches for neither version
    echo "model_check: $m chunk $k/$chunks: the code under test changed while it ran; not recorded" >&2
    return 1
  fi
  # One short line per append: lines of parallel chunks never interleave.
  echo "$m chunk $k/$chunks seed $k histories $chunk steps 40 code $code: $result in $((SECONDS - start)) s," \
    "$(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, MODEL_JOBS=$jobs" >> "$ledger"
  echo "model_check: $m chunk $k/$chunks: $result in $((SECONDS - start)) s"
}

echo "model_check: code $code, $chunks chunks of $chunk histories per state machine, $jobs at a time"
echo "model_check: test_the_model_configuration_compacts"
.venv/bin/python -m pytest -q -p no:cacheprovider tests/test_model.py::test_the_model_configuration_compacts \
  > "$logs/configuration.log" 2>&1 || { echo "model_check: the model's configuration no longer compacts ($logs/configuration.log)"; exit 1; }
rm -f "$logs/STOP"
running=0
for k in $(seq 1 "$chunks"); do  # chunk-major, so every machine advances alike
  for m in "${machines[@]}"; do
    passed_chunk "$m" "$k" && continue
    if [ "$running" -ge "$jobs" ]; then wait -n || true; running=$((running - 1)); fi
    if [ -e "$logs/STOP" ]; then echo "model_check: $logs/STOP: no new chunk started"; break 2; fi
    run_chunk "$m" "$k" &
    running=$((running + 1))
  done
done
wait
tally
