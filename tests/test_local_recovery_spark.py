"""Local recovery through Spark: an executor SIGKILLed mid-stream, a damaged local copy, and an
unwritable local-recovery directory; results always equal the built-in provider's."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from local_recovery_support import damage_one_sst_in_place
from queries import aggregation
from spark_support import HDFS_PROVIDER, OUR_PROVIDER, run_with_restart, start_session

pytestmark = pytest.mark.spark
CONF = "spark.sql.streaming.stateStore.pystatestore."
RESTORE_KEYS = (
    "pystatestoreRestoreLocalFiles",
    "pystatestoreRestoreLocalBytes",
    "pystatestoreRestoreRemoteFiles",
    "pystatestoreRestoreRemoteBytes",
    "pystatestoreRestoreInlineBytes",
    "pystatestoreRestoreChangelogVersions",
)


def restore_totals(progresses: list[dict]) -> dict[str, int]:
    totals = dict.fromkeys(RESTORE_KEYS, 0)
    for p in progresses:
        for op in p.get("stateOperators", []):
            for k in RESTORE_KEYS:
                totals[k] += op["customMetrics"].get(k, 0)
    return totals


@pytest.fixture(scope="module")
def local_spark() -> Iterator[SparkSession]:
    session = start_session("local[2]")
    yield session
    session.stop()


def compare_with_builtin(
    spark: SparkSession,
    tmp_path: Path,
    recovery_dir: Path,
    *,
    before_phase: Callable[[int], None] | None = None,
    before_ours: Callable[[], None] | None = None,
    files_per_phase: int = 3,
) -> list[dict]:
    """Runs the restart scenario with the HDFS provider and ours (local copies in `recovery_dir`),
    asserts equal outputs, and returns every progress report of our run."""
    spark.conf.set(CONF + "localRecoveryDir", str(recovery_dir))
    try:
        expected, _ = run_with_restart(
            spark,
            aggregation,
            provider=HDFS_PROVIDER,
            workdir=tmp_path / "ref",
            output_mode="update",
            files_per_phase=files_per_phase,
        )
        if before_ours is not None:
            before_ours()
        actual, progress = run_with_restart(
            spark,
            aggregation,
            provider=OUR_PROVIDER,
            workdir=tmp_path / "ours",
            output_mode="update",
            files_per_phase=files_per_phase,
            before_phase=before_phase,
            all_progress=True,
        )
    finally:
        spark.conf.unset(CONF + "localRecoveryDir")
    assert actual == expected
    return progress


def our_state_dir(tmp_path: Path) -> Path:
    """Operator 0's state directory of our run in `compare_with_builtin` (a directory per partition)."""
    return tmp_path / "ours" / "ckpt-PythonStateStoreProvider" / "state" / "0"


@pytest.fixture(params=["snapshot", "changelog"])
def commit_mode(request: pytest.FixtureRequest, local_spark: SparkSession) -> Iterator[str]:
    local_spark.conf.set(CONF + "commitMode", request.param)
    yield request.param
    local_spark.conf.unset(CONF + "commitMode")


def test_damaged_local_copy_is_never_used(local_spark: SparkSession, commit_mode: str, tmp_path: Path) -> None:
    recovery = tmp_path / "recovery"
    damaged: list[Path] = []
    totals = restore_totals(
        compare_with_builtin(
            local_spark,
            tmp_path,
            recovery,
            before_phase=lambda phase: damaged.append(damage_one_sst_in_place(recovery)) if phase == 1 else None,
        )
    )
    if commit_mode == "snapshot":
        # the manifest lists the SST: only that file is fetched, the rest comes from the copy
        assert totals["pystatestoreRestoreRemoteFiles"] == 1, (totals, damaged)
        assert totals["pystatestoreRestoreLocalFiles"] > 0, totals
    else:
        # the SST exists only in local copies (the checkpoint holds changes): the damaged copy is
        # passed over and the state rebuilt from further back along the chain, by replaying changes,
        # or from a snapshot of version 3 if maintenance made one between the runs (timing)
        state_dir = our_state_dir(tmp_path)
        restores = restores_in_worker_logs(this_jvms_worker_logs(local_spark))
        from_snapshot = [
            line
            for store in state_dir.iterdir()
            for line in restores.get((str(store), 3), [])
            if line["source"] == "remote"
        ]
        assert totals["pystatestoreRestoreChangelogVersions"] > 0 or from_snapshot, (totals, damaged)


def test_unwritable_local_recovery_dir_restores_from_checkpoint(
    local_spark: SparkSession, commit_mode: str, tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    totals = restore_totals(compare_with_builtin(local_spark, tmp_path, blocker / "recovery"))
    assert totals["pystatestoreRestoreLocalFiles"] == 0, totals
    # The restart rebuilt every store's version 3 from the checkpoint alone. Which part of it depends
    # on timing: the last version's own snapshot, a snapshot maintenance made of it between the runs
    # (small enough to sit inside its manifest), or the changes since an older one.
    state_dir = our_state_dir(tmp_path)
    stores = sorted(str(d) for d in state_dir.iterdir() if d.name.isdigit())
    restores = restores_in_worker_logs(this_jvms_worker_logs(local_spark))
    for store in stores:
        lines = restores.get((store, 3))
        assert lines, ("no restore of version 3 was logged", store, sorted(restores))
        for line in lines:
            assert line["source"] in ("remote", "changelog"), line
            assert (line["local_files"], line["local_bytes"]) == ("0", "0"), line
    if commit_mode == "snapshot":
        assert totals["pystatestoreRestoreRemoteFiles"] > 0, totals


def executor_pids(app_id: str) -> list[int]:
    """Executor JVMs of one application (their command line names it), not of any other."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"org.apache.spark.executor.CoarseGrainedExecutorBackend" in argv and app_id.encode() in argv:
            pids.append(int(proc.name))
    return sorted(pids)


RESTORE_LINE = re.compile(
    r"store (?P<store>\S+)#\S*: restored version (?P<version>\d+) from (?P<source>\S+) in \d+ ms: "
    r"(?P<local_files>\d+) files \((?P<local_bytes>\d+) bytes\) from the local copy, "
    r"(?P<remote_files>\d+) files \((?P<remote_bytes>\d+) bytes\) and (?P<inline_bytes>\d+) bytes inside "
    r"manifests from the checkpoint, "
    r"changes of (?P<replayed>\d+) versions replayed"
)


def this_jvms_worker_logs(spark: SparkSession) -> list[Path]:
    """The logs of the driver JVM's state workers (a local master's executor), those of workers they
    replaced included. The pool outlives a session: earlier tests' sessions may have started it, in
    their own spark.local.dir."""
    pool = spark._jvm.org.pystatestore.StateWorker.currentWorkers()  # type: ignore[union-attr]
    dirs = {Path(pool.apply(i).logFile().getPath()).parent for i in range(pool.size())}
    return sorted(f for d in dirs for f in d.glob("worker-*.log"))


def restores_in_worker_logs(log_files: list[Path]) -> dict[tuple[str, int], list[dict[str, str]]]:
    """Every restore the state workers logged in `log_files`: (store path, version) -> its lines."""
    found: dict[tuple[str, int], list[dict[str, str]]] = {}
    for log_file in log_files:
        for line in log_file.read_text(errors="replace").splitlines():
            m = RESTORE_LINE.search(line)
            if m:
                found.setdefault((urlparse(m["store"]).path, int(m["version"])), []).append(m.groupdict())
    return found


def kill_an_executor_mid_stream(tmp_path: Path) -> tuple[dict[str, int], dict[tuple[str, int], list[dict[str, str]]]]:
    """A run in which one executor is SIGKILLed once version 2 exists: the stores it held (store
    -> the first version the other executor wrote), and the restores the workers logged."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    files_per_phase = 4
    state_dir = our_state_dir(tmp_path)
    local_dir = tmp_path / "spark-local"
    killed: list[int] = []
    # A copy of every version, so that the moved stores (versions 2 and 3) have one to restore from
    spark = start_session(
        "local-cluster[2,1,1024]", **{CONF + "localRecoveryInterval": "1", "spark.local.dir": str(local_dir)}
    )
    app_id = spark.sparkContext.applicationId

    def killer() -> None:
        deadline = time.time() + 300
        while time.time() < deadline and not any(state_dir.glob("*/manifests/2.json")):
            time.sleep(0.02)
        pids = executor_pids(app_id)
        if pids:
            os.kill(pids[-1], signal.SIGKILL)
            killed.append(pids[-1])

    thread = threading.Thread(target=killer, daemon=True)
    try:
        compare_with_builtin(
            spark, tmp_path, tmp_path / "recovery", files_per_phase=files_per_phase, before_ours=thread.start
        )
        thread.join(10)
        # Read before stop(): a JVM that exits normally removes its workers' directory, logs included.
        # Worker logs sit in spark.local.dir/pystatestore-<executor pid>-<random>/ while their JVM runs.
        restores = restores_in_worker_logs(sorted(local_dir.glob("pystatestore-*/worker-*.log")))
    finally:
        spark.stop()
    assert killed, "no executor of this application was killed"
    # Which stores the killed executor held, and the first version another JVM wrote for each
    # (manifests name their writer's JVM): that JVM restored the version before, in the first run.
    moved_at: dict[str, int] = {}
    for store in sorted(d for d in state_dir.iterdir() if d.name.isdigit()):  # partitions, not _metadata
        writers = {
            v: json.loads((store / "manifests" / f"{v}.json").read_text())["writer"]["jvmPid"]
            for v in range(1, files_per_phase + 1)
        }
        for v in range(1, files_per_phase):
            if writers[v] == killed[0] and writers[v + 1] != killed[0]:
                moved_at[str(store)] = v + 1
    assert moved_at, "no store of the killed executor was taken over by the other one"
    return moved_at, restores


@pytest.mark.cluster
def test_executor_killed_mid_stream_restores_locally(tmp_path: Path) -> None:
    # The workers' logs, not the batches' metrics: when the killed executor's shuffle output is
    # lost too, the first attempt restores and then fails to fetch, its metrics are discarded, and
    # the retry finds the version already loaded.
    moved_at, restores = kill_an_executor_mid_stream(tmp_path)
    for store, version in moved_at.items():
        lines = restores.get((store, version - 1))
        assert lines, ("no restore of the moved store was logged", store, version - 1, sorted(restores))
        for line in lines:
            assert line["source"] == "local-copy", line
            assert int(line["local_bytes"]) > 0, line
            assert (line["remote_files"], line["remote_bytes"], line["replayed"]) == ("0", "0", "0"), line


# -- a same-host restart reads no data file from the checkpoint (issue 29) -------------------------
# Every file updates every key, and a version's changes (4,000 keys, about 60 KiB) do not fit inside
# its manifest (16 KiB), so they go to a file of their own, as they do in real state.
RESTART_KEYS = 4_000
RESTART_BATCHES = 6
DATA_DIRS = ("shared", "private", "changelog")  # a store's data files: all but its manifests


def keyed_value(key: int, batch: int) -> int:
    return (key * 7 + batch) % 1000


def write_keyed_files(input_dir: Path, first: int, count: int) -> None:
    """File b updates every one of RESTART_KEYS keys with keyed_value(key, b)."""
    input_dir.mkdir(parents=True, exist_ok=True)
    for b in range(first, first + count):
        f = input_dir / f"b{b:04d}.json"
        rows = (json.dumps({"key": f"k{i}", "value": keyed_value(i, b)}) for i in range(RESTART_KEYS))
        f.write_text("\n".join(rows) + "\n")
        os.utime(f, (1_700_000_000 + b, 1_700_000_000 + b))  # the file source orders files by mtime


def keyed_output(batches: int) -> dict[int, list[tuple]]:
    """The referee: what the query's update output must be at each batch, from the input alone
    (batch b reads file b; every key is updated, with its running sum and count)."""
    totals = [0] * RESTART_KEYS
    out = {}
    for b in range(batches):
        for i in range(RESTART_KEYS):
            totals[i] += keyed_value(i, b)
        out[b] = sorted((f"k{i}", totals[i], b + 1) for i in range(RESTART_KEYS))
    return out


def run_keyed(spark: SparkSession, provider: str, input_dir: Path, checkpoint: Path, results: dict) -> list[dict]:
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", provider)

    def collect(batch, batch_id: int) -> None:  # noqa: ANN001
        results[batch_id] = sorted(tuple(r) for r in batch.collect())

    query = (
        spark.readStream.schema("key string, value long")
        .option("maxFilesPerTrigger", 1)
        .json(str(input_dir))
        .groupBy("key")
        .agg(F.sum("value").alias("total"), F.count("*").alias("n"))
        .writeStream.outputMode("update")
        .foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(600)
    assert query.exception() is None, query.exception()
    return list(query.recentProgress)


@pytest.mark.cluster
# Snapshot mode is marked slow (48 s of CI): test_local_recovery.py restores both modes from local
# copies with every data file of the checkpoint moved away, without Spark; this test's Spark side
# (a new application, the stores' restore on new executors) is the same in both.
@pytest.mark.parametrize("commit_mode", ["changelog", pytest.param("snapshot", marks=pytest.mark.slow)])
def test_a_same_host_restart_reads_no_data_file_from_the_checkpoint(tmp_path: Path, commit_mode: str) -> None:
    """Flink's local recovery: the query stops (its executors and workers exit) and a new
    application restarts it on the same host. With the local copies intact the restart batch
    restores every store from this host alone. The referee does not take our word for it: every
    data file of the checkpoint is moved out of reach before the restart (manifests stay), so a
    restore that read one would fail; the output must still be what the input says."""
    input_dir = tmp_path / "in"
    write_keyed_files(input_dir, 0, RESTART_BATCHES)
    confs = {
        CONF + "commitMode": commit_mode,
        CONF + "localRecoveryDir": str(tmp_path / "recovery"),
        "spark.sql.streaming.stateStore.minDeltasForSnapshot": "3",  # maintenance snapshots too
        "spark.sql.streaming.stateStore.maintenanceInterval": "1s",
    }
    actual: dict[int, list[tuple]] = {}
    spark = start_session("local-cluster[2,1,1024]", **confs)
    try:
        run_keyed(spark, OUR_PROVIDER, input_dir, tmp_path / "ckpt", actual)
    finally:
        spark.stop()  # the executors exit, and with them the workers and their local databases
    stores = sorted(d for d in (tmp_path / "ckpt" / "state" / "0").iterdir() if d.name.isdigit())
    assert any((store / "changelog").exists() or (store / "shared").exists() for store in stores)
    aside = tmp_path / "aside"
    for store in stores:
        for name in DATA_DIRS:
            if (store / name).exists():
                (aside / store.name).mkdir(parents=True, exist_ok=True)
                shutil.move(str(store / name), str(aside / store.name / name))
    write_keyed_files(input_dir, RESTART_BATCHES, 1)
    spark = start_session("local-cluster[2,1,1024]", **confs)
    try:
        progress = run_keyed(spark, OUR_PROVIDER, input_dir, tmp_path / "ckpt", actual)
    finally:
        spark.stop()
        for store in stores:  # the checkpoint whole again (the restart's commits wrote new files beside)
            for f in sorted((aside / store.name).rglob("*")):
                if f.is_file():
                    to = store / f.relative_to(aside / store.name)
                    to.parent.mkdir(parents=True, exist_ok=True)
                    shutil.move(str(f), str(to))
    assert actual == keyed_output(RESTART_BATCHES + 1)
    totals = restore_totals(progress)
    print(f"{commit_mode}: the restart batch restored {totals}")
    assert totals["pystatestoreRestoreLocalFiles"] > 0, totals
    assert (totals["pystatestoreRestoreRemoteFiles"], totals["pystatestoreRestoreRemoteBytes"]) == (0, 0), totals
    # The manifests (and changes stored inside them) always come from the checkpoint, and are counted.
    reported = {k for p in progress for op in p.get("stateOperators", []) for k in op.get("customMetrics", {})}
    assert "pystatestoreRestoreInlineBytes" in reported, sorted(reported)
