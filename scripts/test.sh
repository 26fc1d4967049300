#!/usr/bin/env bash
# README's test command: sets everything up, then runs lint and the test suites against the
# installed wheel:
#   - the whole suite (unit, model-based, JVM contract, end-to-end on local[2] and
#     local-cluster[2,1,1024], faults, security) on the default Spark minor (what pip gives);
#   - the contract suite (the default backend: the adapter that differs per minor is the same for
#     every backend), the end-to-end suite, the fault tests, the coordinator test, the same-host
#     restart test and the GC test (on local-cluster[2,1,1024] only: local[2] runs the same provider
#     code in one JVM; in the default commit mode only: the modes differ in the worker's Python, the
#     same on every minor), the offline reader's comparison with Spark's state reader, three state
#     rewrites (RocksDB to ours, ours to HDFS, a join from 4 to 7 partitions) and checkpoint format
#     v2 (an aggregation, a join, a retried commit, a restart at an older attempt), and the first error
#     of a worker that cannot start (a commit's, a load's: Spark's error classes per minor) on every
#     other supported minor,
#     with that minor's pyspark (installed once per machine by setup) first on PYTHONPATH.
# Tests marked slow (the chaos matrix's fixed seeds, the scale test's control, the Scala job on local[2], the
# same-host restart in snapshot mode) are
# left out; extra arguments go to the default minor's pytest, after ours: `bash scripts/test.sh
# -m ""` runs the slow ones too. Ends with one line that totals every run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "test: ruff"
.venv/bin/ruff check python tests scripts setup.py

export PYSTATESTORE_TEST_INSTALLED=1
# Every JVM of the tests (Spark's drivers and executors, spark-submit, scalac) runs for seconds to
# minutes: HotSpot's C2 compiler costs such a JVM more CPU than it saves on 2 cores (three end-to-end
# queries: 181 -> 123 s). Only the speed differs; the long runs (scripts/long.sh) and the benchmarks
# keep HotSpot's defaults.
export JAVA_TOOL_OPTIONS="-XX:TieredStopAtLevel=1${JAVA_TOOL_OPTIONS:+ $JAVA_TOOL_OPTIONS}"
results=.test-results
rm -rf "$results"; mkdir -p "$results"
status=0

echo "test: Scala unit tests (jvm-shim/src/test/scala, ScalaTest)"
gradle --no-daemon -q scalaTest -PtestResults="$results" || status=1

run_suite() {  # minor, then pytest arguments
  local minor=$1; shift
  echo "test: pytest on Spark $minor"
  PYSTATESTORE_EXPECT_SPARK_MINOR=$minor .venv/bin/python -m pytest -q -p no:cacheprovider \
    -o console_output_style=classic --junitxml="$results/spark-$minor.xml" -m "not slow" "$@" || status=1
}

default_minor=$(.venv/bin/python -c "from pystatestore.spark_minors import DEFAULT_MINOR; print(DEFAULT_MINOR)")
run_suite "$default_minor" tests "$@"

OTHER_MINOR_TESTS=(
  tests/test_packaging.py
  tests/test_contract.py
  tests/test_e2e.py
  tests/test_faults.py
  "tests/test_coordinator.py::test_snapshots_are_reported_so_spark_never_forces_them[local-cluster[2,1,1024]-changelog]"
  "tests/test_coordinator.py::test_a_commit_that_makes_a_snapshot_due_gets_it_without_waiting_for_maintenance"
  "tests/test_local_recovery_spark.py::test_a_same_host_restart_reads_no_data_file_from_the_checkpoint[changelog]"
  "tests/test_incremental.py::test_gc_after_30_batches_keeps_exactly_what_retained_versions_reference"
  "tests/test_cli.py::test_read_equals_sparks_state_reader"
  tests/test_spark_limits.py
  tests/test_transform_with_state.py
  tests/test_transform_with_state_scala.py
  "tests/test_checkpoint_v2.py::test_v2_queries_equal_sparks_rocksdb_provider_in_v2[aggregation_update]"
  "tests/test_checkpoint_v2.py::test_v2_queries_equal_sparks_rocksdb_provider_in_v2[stream_stream_join]"
  tests/test_checkpoint_v2.py::test_a_retried_tasks_commit_is_the_one_spark_continues_from
  tests/test_checkpoint_v2.py::test_a_restart_loads_the_attempt_the_commit_log_names
  "tests/test_state_rewrite.py::test_every_route_continues_exactly[rocksdb_to_ours-aggregation]"
  "tests/test_state_rewrite.py::test_every_route_continues_exactly[ours_to_hdfs-aggregation]"
  "tests/test_state_rewrite.py::test_every_route_continues_exactly[ours_4_to_7_partitions-stream_stream_join]"
  "tests/test_first_error.py::test_a_python_without_pystatestore_is_named_once_per_jvm[local-cluster[2,1,1024]]"
  tests/test_first_error.py::test_a_restart_whose_worker_cannot_start_fails_its_load_with_the_same_text
)
for minor in $(.venv/bin/python -c "from pystatestore.spark_minors import BUILT_AGAINST, DEFAULT_MINOR
print(' '.join(m for m in BUILT_AGAINST if m != DEFAULT_MINOR))"); do
  pyspark_dir=$(.venv/bin/python scripts/build_jar.py --pyspark-path "$minor")
  PYTHONPATH="$pyspark_dir" PYSTATESTORE_TEST_MASTERS="local-cluster[2,1,1024]" PYSTATESTORE_CONTRACT_BACKENDS=rocksdb \
    PYSTATESTORE_TEST_COMMIT_MODES=changelog \
    run_suite "$minor" "${OTHER_MINOR_TESTS[@]}"
done

.venv/bin/python scripts/test_totals.py "$results"/*.xml || status=1
exit $status
