#!/usr/bin/env bash
# The long runs, behind one command: what the test command (scripts/test.sh, at most 30 minutes)
# leaves out because it takes hours or tests the same behaviour again in every combination.
#
#   bash scripts/long.sh              every run below, in this order
#   bash scripts/long.sh NAME...      only those (names as below)
#
#   slow         the tests marked slow (the chaos matrix's fixed seeds, the scale test's control, the
#                Scala job on local[2], the same-host restart in snapshot mode)
#   matrix       the end-to-end queries on every master in every commit mode (PYSTATESTORE_TEST_MATRIX=full)
#   minors       the default minor's whole suite on every other supported minor
#   power-cut    scripts/power_cut.py: longer histories, more seeds and draws
#   chaos        scripts/chaos.py --runs 50: the fault matrix from a seed drawn now
#   soak         scripts/bench_soak.py: Spark's defaults (200 partitions, its maintenance, coordinator
#                and retention) for 30 minutes a provider, ours against Spark's RocksDB provider
#   model        scripts/model_check.sh: 10,000 histories per state machine, resumable (hours)
#
# Each prints one verdict line, `long: NAME: PASS|FAIL ...`, with where its whole output is
# (.test-results/long/NAME.log). Exits 0 only if every run it was asked for passed.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh > /dev/null || { echo "long: setup failed: run bash scripts/setup.sh to see why"; exit 1; }
logs=.test-results/long
mkdir -p "$logs"
export PYSTATESTORE_TEST_INSTALLED=1
ALL=(slow matrix minors power-cut chaos soak model)
status=0

verdict() {  # name, passed (0/1), detail
  local word=PASS; [ "$2" -eq 0 ] || { word=FAIL; status=1; }
  echo "long: $1: $word ($3; log: $logs/$1.log)"
}

pytest_summary() {  # the last summary line of a pytest log
  grep -E "^=+ .*(passed|failed|error).* in " "$1" | tail -1 | sed -E 's/^=+ //; s/ =+$//'
}

other_minors() {
  .venv/bin/python -c "from pystatestore.spark_minors import BUILT_AGAINST, DEFAULT_MINOR
print(' '.join(m for m in BUILT_AGAINST if m != DEFAULT_MINOR))"
}

run() {
  local name=$1 log=$logs/$1.log rc=0
  case $name in
    slow)
      .venv/bin/python -m pytest -p no:cacheprovider -m slow tests > "$log" 2>&1 || rc=$?
      verdict slow "$rc" "$(pytest_summary "$log")" ;;
    matrix)
      PYSTATESTORE_TEST_MATRIX=full .venv/bin/python -m pytest -p no:cacheprovider tests/test_e2e.py > "$log" 2>&1 || rc=$?
      verdict matrix "$rc" "$(pytest_summary "$log")" ;;
    minors)
      : > "$log"
      local detail=""
      for minor in $(other_minors); do
        local dir; dir=$(.venv/bin/python scripts/build_jar.py --pyspark-path "$minor")
        local one=0
        PYTHONPATH="$dir" PYSTATESTORE_EXPECT_SPARK_MINOR=$minor .venv/bin/python -m pytest -p no:cacheprovider \
          -m "not slow" tests >> "$log" 2>&1 || one=$?
        [ "$one" -eq 0 ] || rc=1
        detail+="Spark $minor: $(pytest_summary "$log"); "
      done
      verdict minors "$rc" "${detail%; }" ;;
    power-cut)
      .venv/bin/python scripts/power_cut.py > "$log" 2>&1 || rc=$?
      verdict power-cut "$rc" "$(tail -1 "$log")" ;;
    chaos)
      .venv/bin/python scripts/chaos.py --runs 50 > "$log" 2>&1 || rc=$?
      verdict chaos "$rc" "$(grep -E '^chaos: [0-9]+/' "$log" | tail -1)" ;;
    soak)
      .venv/bin/python scripts/bench_soak.py --minutes 30 --out "$logs/soak-report.txt" > "$log" 2>&1 || rc=$?
      local missed="no report"
      [ -f "$logs/soak-report.txt" ] && missed=$(grep -c '^ *\[MISSED\]' "$logs/soak-report.txt")
      [ "$missed" = "0" ] || rc=1
      verdict soak "$rc" "goals missed: $missed; report: $logs/soak-report.txt" ;;
    model)
      bash scripts/model_check.sh > "$log" 2>&1 || rc=$?
      verdict model "$rc" "$(grep -E '^model_check: (every|FAILED|not complete)' "$log" | tail -1)" ;;
    *)
      echo "long: no run named '$name' (runs: ${ALL[*]})"; status=2 ;;
  esac
}

names=("$@")
[ ${#names[@]} -gt 0 ] || names=("${ALL[@]}")
for name in "${names[@]}"; do run "$name"; done
exit $status
