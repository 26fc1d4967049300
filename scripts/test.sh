#!/usr/bin/env bash
# README's test command: sets everything up, then runs lint and the tests against the installed
# wheel, in at most 30 minutes on a fresh 2-core machine (decision 0049):
#   - the shim's Scala unit tests (jvm-shim/src/test/scala, ScalaTest);
#   - every test not marked slow on the default Spark minor (what pip gives);
#   - on every other supported minor, with that minor's pyspark (installed once per machine by setup)
#     first on PYTHONPATH, what differs between minors: the packaging and jar checks, the JVM
#     contract suite (the shim's adapters; the default backend), one end-to-end query on
#     local-cluster, Spark's error classes (a damaged manifest, a worker that cannot start, at a
#     commit and at a load), the coordinator's reports, Spark's state reader on our checkpoints, the
#     gates Spark keeps for its RocksDB provider, transformWithState (4.1), checkpoint format v2, and
#     the rewrite routes through Spark's own providers.
# Every behaviour is tested once, not in every combination of master, commit mode and minor:
# `bash scripts/long.sh` runs the slow tests, the whole matrix and the other minors' whole suite.
# Extra arguments go to the default minor's pytest, after ours. Ends with one line that totals every run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "test: ruff (${SECONDS}s since the start)"
.venv/bin/ruff check python tests scripts setup.py

export PYSTATESTORE_TEST_INSTALLED=1
# Every JVM of the tests (Spark's drivers and executors, spark-submit, scalac) runs for seconds to
# minutes: HotSpot's C2 compiler costs such a JVM more CPU than it saves on 2 cores (three end-to-end
# queries: 181 -> 123 s). Only the speed differs; the long runs (scripts/long.sh) and the benchmarks
# keep HotSpot's defaults.
export JAVA_TOOL_OPTIONS="-XX:TieredStopAtLevel=1${JAVA_TOOL_OPTIONS:+ $JAVA_TOOL_OPTIONS}"
results=.test-results
rm -rf "$results"; mkdir -p "$results"
export PYSTATESTORE_TEST_RESULTS="$PWD/$results"
status=0
# Two test modules at a time (pytest-xdist, a module's tests on one worker, sharing its Spark
# session): one module's JVMs and workers leave much of the 2 cores idle (4.3: 1262 s -> 940 s).
workers=${PYSTATESTORE_TEST_WORKERS:-2}

echo "test: Scala unit tests (jvm-shim/src/test/scala, ScalaTest)"
gradle --no-daemon -q scalaTest -PtestResults="$results" || status=1

run_suite() {  # minor, then pytest arguments
  local minor=$1; shift
  echo "test: pytest on Spark $minor (${SECONDS}s since the start)"
  PYSTATESTORE_EXPECT_SPARK_MINOR=$minor .venv/bin/python -m pytest -q -p no:cacheprovider -n "$workers" \
    --dist loadfile -o console_output_style=classic --junitxml="$results/spark-$minor.xml" -m "not slow" "$@" \
    || status=1
  cat "$results/contract-times-spark-$minor.txt" 2>/dev/null || true
}

default_minor=$(.venv/bin/python -c "from pystatestore.spark_minors import DEFAULT_MINOR; print(DEFAULT_MINOR)")
run_suite "$default_minor" tests "$@"

# The longest modules first (transformWithState, 4.1 only; the contract suite): a worker takes a
# module whole, and one started last keeps the other worker idle until it ends.
OTHER_MINOR_TESTS=(
  tests/test_transform_with_state.py
  tests/test_transform_with_state_scala.py
  tests/test_contract.py
  tests/test_packaging.py
  "tests/test_e2e.py::test_same_rows_as_the_builtin_provider[aggregation_update-local-cluster[2,1,1024]-changelog]"
  "tests/test_faults.py::test_damaged_manifest_names_store_version_file_and_deletes_nothing[truncate]"
  "tests/test_first_error.py::test_a_python_without_pystatestore_is_named_once_per_jvm[local-cluster[2,1,1024]]"
  tests/test_first_error.py::test_a_restart_whose_worker_cannot_start_fails_its_load_with_the_same_text
  "tests/test_coordinator.py::test_snapshots_are_reported_so_spark_never_forces_them[local-cluster[2,1,1024]-changelog]"
  "tests/test_cli.py::test_read_equals_sparks_state_reader"
  tests/test_spark_limits.py
  "tests/test_checkpoint_v2.py::test_v2_queries_equal_sparks_rocksdb_provider_in_v2[aggregation_update]"
  tests/test_checkpoint_v2.py::test_a_retried_tasks_commit_is_the_one_spark_continues_from
  tests/test_checkpoint_v2.py::test_a_restart_loads_the_attempt_the_commit_log_names
  "tests/test_state_rewrite.py::test_every_route_continues_exactly[rocksdb_to_ours-aggregation]"
  "tests/test_state_rewrite.py::test_every_route_continues_exactly[ours_to_hdfs-aggregation]"
)
for minor in $(.venv/bin/python -c "from pystatestore.spark_minors import BUILT_AGAINST, DEFAULT_MINOR
print(' '.join(m for m in BUILT_AGAINST if m != DEFAULT_MINOR))"); do
  pyspark_dir=$(.venv/bin/python scripts/build_jar.py --pyspark-path "$minor")
  PYTHONPATH="$pyspark_dir" PYSTATESTORE_TEST_MASTERS="local-cluster[2,1,1024]" PYSTATESTORE_CONTRACT_BACKENDS=rocksdb \
    PYSTATESTORE_TEST_COMMIT_MODES=changelog \
    run_suite "$minor" "${OTHER_MINOR_TESTS[@]}"
done

.venv/bin/python scripts/test_totals.py "$results"/*.xml || status=1
echo "test: ${SECONDS}s in all"
exit $status
