"""`pystatestore migrate` and `repartition` (issue 32): a query runs some batches on provider A with
P partitions, its checkpoint is rewritten, and it runs more batches on the result; its output must
equal, batch for batch, a reference run that used the target provider and partition count from the
start. The session keeps A and P after the rewrite: the new checkpoint alone must carry the change."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from pystatestore.store.errors import StateStoreError
from pystatestore.tools.rewrite import rewrite, runs_without_spark
from pystatestore.tools.rewrite_plan import PROVIDERS, RewriteError, plan_rewrite
from queries import aggregation, dedup, dedup_within_watermark, join, pandas_sessions, session_windows, windowed
from spark_support import (
    HDFS_PROVIDER,
    OUR_PROVIDER,
    ROCKSDB_PROVIDER,
    run_phase,
    start_session,
    unload_state_stores,
    write_input_files,
)

pytestmark = pytest.mark.spark
PARTITIONS = "spark.sql.shuffle.partitions"


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = start_session("local[2]", **{"spark.sql.adaptive.enabled": "false"})
    yield session
    session.stop()


SCENARIOS: dict[str, tuple[Callable[[DataFrame], DataFrame], str]] = {
    "aggregation": (aggregation, "update"),
    "window_aggregation": (windowed, "append"),
    "session_window": (session_windows, "append"),
    "drop_duplicates": (dedup, "append"),
    "drop_duplicates_within_watermark": (dedup_within_watermark, "append"),
    "apply_in_pandas_with_state": (pandas_sessions, "update"),
    "stream_stream_join": (join, "append"),
}


def tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def run_batches(
    spark: SparkSession,
    scenario: str,
    *,
    provider: str,
    partitions: int,
    input_dir: Path,
    checkpoint: Path,
    results: dict[int, list[tuple]],
) -> None:
    build, mode = SCENARIOS[scenario]
    spark.conf.set(PARTITIONS, str(partitions))
    run_phase(
        spark, build, provider=provider, input_dir=input_dir, checkpoint=checkpoint, output_mode=mode, results=results
    )
    unload_state_stores(spark)


def source_checkpoint(
    spark: SparkSession,
    scenario: str,
    tmp: Path,
    *,
    provider: str,
    partitions: int,
    files: int = 3,
    results: dict[int, list[tuple]] | None = None,
) -> Path:
    """The checkpoint a rewrite starts from: the scenario's first `files` batches at `tmp/ckpt`."""
    write_input_files(tmp / "in", 0, files)
    run_batches(
        spark,
        scenario,
        provider=provider,
        partitions=partitions,
        input_dir=tmp / "in",
        checkpoint=tmp / "ckpt",
        results={} if results is None else results,
    )
    return tmp / "ckpt"


def outputs(results: dict[int, list[tuple]]) -> list[list[tuple]]:
    return [results[b] for b in sorted(results)]


_references: dict[tuple[str, str, int], list[list[tuple]]] = {}


def reference(spark: SparkSession, scenario: str, provider: str, partitions: int, tmp: Path) -> list[list[tuple]]:
    """The query on the target provider and partition count from the start, stopped where the
    rewritten one is rewritten (so both see the same batches)."""
    key = (scenario, provider, partitions)
    if key not in _references:
        work = tmp / "reference"
        results: dict[int, list[tuple]] = {}
        for phase in range(2):
            write_input_files(work / "in", phase * 3, 3)
            run_batches(
                spark,
                scenario,
                provider=provider,
                partitions=partitions,
                input_dir=work / "in",
                checkpoint=work / "ckpt",
                results=results,
            )
        _references[key] = outputs(results)
        shutil.rmtree(work)
    return _references[key]


def rewritten_run(
    spark: SparkSession,
    scenario: str,
    tmp: Path,
    *,
    source: str,
    p: int,
    target: str,
    n: int,
    source_conf: dict[str, str] | None = None,
) -> tuple[list[list[tuple]], Path]:
    command = "migrate" if source != target else "repartition"
    results: dict[int, list[tuple]] = {}
    for k, v in (source_conf or {}).items():
        spark.conf.set(k, v)
    try:
        ckpt = source_checkpoint(spark, scenario, tmp, provider=source, partitions=p, results=results)
    finally:
        for k in source_conf or {}:
            spark.conf.unset(k)
    if (source_conf or {}).get("spark.sql.streaming.stateStore.pystatestore.commitMode") == "snapshot":
        kinds = {json.loads(m.read_text())["kind"] for m in ckpt.rglob("manifests/*.json")}
        assert kinds == {"snapshot"}, f"the source was to be written in snapshot commits: {kinds}"
    new = tmp / "rewritten"
    before = tree_digest(ckpt)
    to = next(name for name, cls in PROVIDERS.items() if cls == target)
    plan = plan_rewrite(command, str(ckpt), str(new), **({"to": to} if command == "migrate" else {"partitions": n}))
    # Between pystatestore checkpoints the rewrite runs without Spark: given no session, it must.
    direct = source == target == OUR_PROVIDER
    assert runs_without_spark(plan) == direct
    rewrite(plan, None if direct else spark, lambda what, done, total: None)
    assert tree_digest(ckpt) == before, "the rewrite changed its source checkpoint"
    write_input_files(tmp / "in", 3, 3)
    # The session still names the source provider and partition count: the checkpoint decides.
    run_batches(spark, scenario, provider=source, partitions=p, input_dir=tmp / "in", checkpoint=new, results=results)
    assert plan.write_batch not in results, "the rewrite's batch reads no input and never runs"
    return outputs(results), new


def store_files(checkpoint: Path, operator: int = 0) -> set[str]:
    return {p.name for p in (checkpoint / "state" / str(operator)).rglob("*") if p.is_file()}


# A windowed aggregation is the same operator as the aggregation, its key a struct as the session
# window's is: in the long runs.
@pytest.mark.parametrize(
    "scenario", [pytest.param(s, marks=pytest.mark.slow) if s == "window_aggregation" else s for s in SCENARIOS]
)
def test_migrating_from_spark_hdfs_provider_continues_exactly(
    spark: SparkSession, tmp_path: Path, scenario: str
) -> None:
    got, new = rewritten_run(spark, scenario, tmp_path, source=HDFS_PROVIDER, p=3, target=OUR_PROVIDER, n=3)
    assert got == reference(spark, scenario, OUR_PROVIDER, 3, tmp_path)
    assert any(name.endswith(".json") for name in store_files(new)), "the new checkpoint's state is pystatestore's"


ROUTES = {
    "rocksdb_to_ours": (ROCKSDB_PROVIDER, 3, OUR_PROVIDER, 3),
    "ours_to_rocksdb": (OUR_PROVIDER, 3, ROCKSDB_PROVIDER, 3),
    "ours_to_hdfs": (OUR_PROVIDER, 3, HDFS_PROVIDER, 3),
    "ours_4_to_7_partitions": (OUR_PROVIDER, 4, OUR_PROVIDER, 7),
    # Spark's default partition count, down to a quarter (the benchmark's case, at test scale)
    "ours_200_to_50_partitions": (OUR_PROVIDER, 200, OUR_PROVIDER, 50),
    "hdfs_7_to_2_partitions": (HDFS_PROVIDER, 7, HDFS_PROVIDER, 2),
    "ours_in_snapshot_commits_to_hdfs": (OUR_PROVIDER, 3, HDFS_PROVIDER, 3),
    # without Spark, from stores restored from SST snapshots rather than read as changelog segments
    "ours_in_snapshot_commits_4_to_7_partitions": (OUR_PROVIDER, 4, OUR_PROVIDER, 7),
}
# The source's conf per route: pystatestore commits changelogs by default; one route reads snapshot commits.
SNAPSHOT_COMMITS = {"spark.sql.streaming.stateStore.pystatestore.commitMode": "snapshot"}
SOURCE_CONF = {
    "ours_in_snapshot_commits_to_hdfs": SNAPSHOT_COMMITS,
    "ours_in_snapshot_commits_4_to_7_partitions": SNAPSHOT_COMMITS,
}


# Every route with an aggregation; the join's keyWithIndexToValue (keyed by more than the shuffle
# key) and the session window's prefix-scan store where keys move between partitions or formats.
# The long runs (scripts/long.sh slow) add what the rest already cover: 200 to 50 partitions (the
# 4 to 7 routes move keys the same way, 48 s of a contended run at 200), and snapshot commits to HDFS
# (their read is the snapshot route to 7 partitions', HDFS's write the changelog route's).
LONG_ROUTES = ("ours_200_to_50_partitions", "ours_in_snapshot_commits_to_hdfs")
ROUTE_CASES = [
    *(
        pytest.param(r, "aggregation", marks=pytest.mark.slow) if r in LONG_ROUTES else (r, "aggregation")
        for r in ROUTES
    ),
    ("ours_4_to_7_partitions", "stream_stream_join"),
    ("ours_to_rocksdb", "stream_stream_join"),
    ("hdfs_7_to_2_partitions", "session_window"),
    ("ours_4_to_7_partitions", "session_window"),
]


@pytest.mark.parametrize(("route", "scenario"), ROUTE_CASES)
def test_every_route_continues_exactly(spark: SparkSession, tmp_path: Path, route: str, scenario: str) -> None:
    source, p, target, n = ROUTES[route]
    got, new = rewritten_run(
        spark, scenario, tmp_path, source=source, p=p, target=target, n=n, source_conf=SOURCE_CONF.get(route)
    )
    assert got == reference(spark, scenario, target, n, tmp_path)
    partitions = {int(d.name) for d in (new / "state" / "0").iterdir() if d.name.isdigit()}
    assert partitions == set(range(n))


def test_an_interrupted_rewrite_leaves_a_checkpoint_spark_refuses(spark: SparkSession, tmp_path: Path) -> None:
    ckpt = source_checkpoint(spark, "stream_stream_join", tmp_path, provider=HDFS_PROVIDER, partitions=3)
    new = tmp_path / "rewritten"
    before = tree_digest(ckpt)
    plan = plan_rewrite("migrate", str(ckpt), str(new), to="pystatestore")
    assert len(plan.stores) == 4

    started: set[str] = set()

    def die_at_the_third_store(what: str, done: int, total: int) -> None:
        if what.startswith("writing"):
            started.add(what)
            if len(started) == 3:
                raise KeyboardInterrupt  # what a user's Ctrl-C does mid-run

    with pytest.raises(KeyboardInterrupt):
        rewrite(plan, spark, die_at_the_third_store)
    assert tree_digest(ckpt) == before
    assert len(started) == 3, "the run stopped after writing two of the join's four stores"
    with pytest.raises(Exception, match="MALFORMED_LOG_FILE.*pystatestore-rewrite-unfinished"):
        run_batches(
            spark,
            "stream_stream_join",
            provider=HDFS_PROVIDER,
            partitions=3,
            input_dir=tmp_path / "in",
            checkpoint=new,
            results={},
        )
    with pytest.raises(RewriteError, match="unfinished output of an interrupted rewrite"):
        plan_rewrite("repartition", str(new), str(tmp_path / "again"), partitions=5)
    with pytest.raises(RewriteError, match="the output exists"):
        plan_rewrite("migrate", str(ckpt), str(new), to="pystatestore")


def test_an_interrupted_rewrite_without_spark_leaves_a_checkpoint_spark_refuses(
    spark: SparkSession, tmp_path: Path
) -> None:
    ckpt = source_checkpoint(spark, "aggregation", tmp_path, provider=OUR_PROVIDER, partitions=4)
    new = tmp_path / "rewritten"
    before = tree_digest(ckpt)
    plan = plan_rewrite("repartition", str(ckpt), str(new), partitions=7)
    assert runs_without_spark(plan)

    def die_at_the_third_store_written(what: str, done: int, total: int) -> None:
        if what.startswith("writing") and done == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        rewrite(plan, None, die_at_the_third_store_written)
    assert tree_digest(ckpt) == before
    assert (new / "state" / "0" / "1" / "manifests").is_dir(), "the run stopped after writing stores"
    with pytest.raises(Exception, match="MALFORMED_LOG_FILE.*pystatestore-rewrite-unfinished"):
        run_batches(
            spark,
            "aggregation",
            provider=OUR_PROVIDER,
            partitions=4,
            input_dir=tmp_path / "in",
            checkpoint=new,
            results={},
        )


def test_what_a_rewrite_refuses_it_names_and_writes_nothing(spark: SparkSession, tmp_path: Path) -> None:
    ckpt = source_checkpoint(spark, "aggregation", tmp_path, provider=HDFS_PROVIDER, partitions=3, files=2)
    out = tmp_path / "out"
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: plan_rewrite("migrate", str(ckpt), str(out), to="hdfs"), "already uses hdfs"),
        (lambda: plan_rewrite("repartition", str(ckpt), str(out), partitions=3), "already has 3 partitions"),
        (lambda: plan_rewrite("migrate", str(ckpt), str(ckpt / "inside"), to="pystatestore"), "outside the source"),
        (lambda: plan_rewrite("migrate", str(tmp_path / "in"), str(out), to="pystatestore"), "not a Spark streaming"),
    ]
    for call, message in cases:
        with pytest.raises(StateStoreError, match=message) as refused:
            call()
        assert not out.exists()
        assert "Nothing was written" in refused.value.advice, refused.value
    # A batch planned but not committed: the query runs, or died mid-batch.
    last = max(int(p.name) for p in (ckpt / "offsets").iterdir() if p.name.isdigit())
    shutil.copy(ckpt / "offsets" / str(last), ckpt / "offsets" / str(last + 1))
    with pytest.raises(StateStoreError, match=f"batch {last + 1} is planned but not committed"):
        plan_rewrite("migrate", str(ckpt), str(out), to="pystatestore")
    assert not out.exists()


def test_the_command_prints_its_plan_and_what_it_wrote(spark: SparkSession, tmp_path: Path) -> None:
    """As a user runs it: `pystatestore repartition` in a process of its own (between pystatestore
    checkpoints it starts no JVM)."""
    import os
    import subprocess
    import sys

    ckpt = source_checkpoint(spark, "aggregation", tmp_path, provider=OUR_PROVIDER, partitions=3, files=2)
    out = tmp_path / "out"
    # The command imports the pystatestore this test does (the source tree, or the installed wheel).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pystatestore.tools.cli", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )

    plan = cli("repartition", str(ckpt), "--partitions", "5", "-o", str(out), "--dry-run")
    assert plan.returncode == 0, plan.stderr
    assert "partitions 3 -> 5" in plan.stdout and "operator 0 (stateStoreSave)" in plan.stdout, plan.stdout
    assert "15 keys" in plan.stdout, plan.stdout  # as the manifests record them
    assert "runs without Spark" in plan.stdout, plan.stdout
    assert not out.exists()
    done = cli("repartition", str(ckpt), "--partitions", "5", "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert "15 keys in 5 partitions" in done.stdout and f"wrote {out}" in done.stdout, done.stdout
    offsets = sorted((out / "offsets").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1)[-1]
    conf = json.loads(offsets.read_text().splitlines()[1])["conf"]
    assert (
        conf["spark.sql.shuffle.partitions"] == "5"
        and conf["spark.sql.streaming.stateStore.providerClass"] == OUR_PROVIDER
    )
    again = cli("repartition", str(ckpt), "--partitions", "5", "-o", str(out))
    assert again.returncode == 1 and "the output exists" in again.stderr, again.stderr
