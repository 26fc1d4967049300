"""Faults through Spark: a damaged checkpoint gives an actionable error and deletes nothing; a
worker killed mid-stream costs a task retry, not a wrong result."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pystatestore.worker.service import StoreService
from queries import aggregation
from spark_support import HDFS_PROVIDER, OUR_PROVIDER, run_phase, run_with_restart, start_session, write_input_files

pytestmark = pytest.mark.spark
CONF = "spark.sql.streaming.stateStore.pystatestore."


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    # local[2,4]: local mode with task retries, as a cluster would retry a failed task
    session = start_session("local[2,4]")
    yield session
    session.stop()


def snapshot_tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def run_ours(spark: SparkSession, input_dir: Path, ckpt: Path) -> None:
    run_phase(
        spark,
        aggregation,
        provider=OUR_PROVIDER,
        input_dir=input_dir,
        checkpoint=ckpt,
        output_mode="update",
        results={},
    )


def first_phase(spark: SparkSession, tmp_path: Path) -> tuple[Path, Path]:
    input_dir, ckpt = tmp_path / "in", tmp_path / "ckpt"
    write_input_files(input_dir, 0, 2)
    run_ours(spark, input_dir, ckpt)
    write_input_files(input_dir, 2, 1)
    return input_dir, ckpt


def restart_error(spark: SparkSession, input_dir: Path, ckpt: Path) -> str:
    with pytest.raises(Exception) as e:
        run_ours(spark, input_dir, ckpt)
    return str(e.value)


def age_everything(root: Path, seconds: float) -> None:
    for p in root.rglob("*"):
        st = p.stat()
        os.utime(p, (st.st_atime - seconds, st.st_mtime - seconds))


def run_store_gc(store: Path, local: Path, retain: int) -> dict:
    """What the next writer's maintenance does to this store: the worker's own service, no Spark."""
    service = StoreService()
    desc = {
        "storeDir": f"file:{store}",
        "instanceId": "gc",
        "operatorId": 0,
        "partitionId": int(store.name),
        "storeName": "default",
        "keySchema": "",
        "valueSchema": "",
        "minVersionsToRetain": retain,
        "localDir": str(local),
        "options": {"localRecovery": "false"},
    }
    handle = json.loads(service.openStore(json.dumps(desc)))["handle"]
    try:
        return json.loads(service.maintenance(handle))
    finally:
        service.close_all()


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_damaged_manifest_names_store_version_file_and_deletes_nothing(
    spark: SparkSession, tmp_path: Path, damage: str
) -> None:
    input_dir, ckpt = first_phase(spark, tmp_path)
    store = ckpt / "state" / "0" / "1"
    manifest = store / "manifests" / "2.json"
    data = manifest.read_bytes()
    manifest.write_bytes(data[: len(data) // 3] if damage == "truncate" else b"\x00\xff not json")
    before, everything_before = snapshot_tree(store), snapshot_tree(ckpt / "state")
    message = restart_error(spark, input_dir, ckpt)
    assert str(store) in message and "version: 2" in message and "manifests/2.json" in message, message
    assert snapshot_tree(store) == before, "the failed restart changed the damaged store"
    everything_after = snapshot_tree(ckpt / "state")  # other partitions may have committed, not lost
    assert all(everything_after.get(k) == v for k, v in everything_before.items())
    # Garbage collection on the damaged store, with retention as tight as it goes and every file
    # past the grace period: what version 2 needs (its chain may reach back through version 1) is
    # unknown, so nothing may go.
    age_everything(store, 3600)
    report = run_store_gc(store, tmp_path / "gc", retain=0)
    assert report.get("deletedManifests") == 0 and report.get("deletedFiles") == 0, report
    assert snapshot_tree(store) == before


def delete_a_file_of_version_2(ckpt: Path) -> tuple[Path, str]:
    """Deletes an SST or other file a snapshot manifest lists, or a changelog version's changes."""
    store = ckpt / "state" / "0" / "2"
    manifest = json.loads((store / "manifests" / "2.json").read_text())
    if manifest["kind"] == "changelog":
        victim = manifest["changes"]["path"]
        # A snapshot maintenance may have made of version 2 (Spark 4.3 also maintains a provider as
        # it unloads it) would serve the restart without the changes: the loss is of both.
        for snapshot in (store / "snapshots").glob("2-*"):
            os.remove(snapshot)
    else:
        files = [ref for kind in ("shared", "private") for ref in manifest[kind].values()]
        victim = sorted(ref["path"] for ref in files if "path" in ref)[0]  # not one stored inline
    os.remove(store / victim)
    return store, victim


# changelog: the changes of every version in a file of their own (none inline), so there is one to lose
MODES = {"snapshot": {"commitMode": "snapshot"}, "changelog": {"commitMode": "changelog", "inlineThresholdBytes": "0"}}


@contextmanager
def confs(spark: SparkSession, **values: str) -> Iterator[None]:
    for key, value in values.items():
        spark.conf.set(CONF + key, value)
    try:
        yield
    finally:
        for key in values:
            spark.conf.unset(CONF + key)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_missing_data_file_names_the_file(spark: SparkSession, tmp_path: Path, mode: str) -> None:
    # Without local copies the checkpoint is the only source, so the loss must be reported.
    with confs(spark, localRecovery="false", **MODES[mode]):
        input_dir, ckpt = first_phase(spark, tmp_path)
        store, victim = delete_a_file_of_version_2(ckpt)
        held = sorted(str(p.relative_to(store)) for p in store.rglob("*") if p.is_file())
        try:
            message = restart_error(spark, input_dir, ckpt)
        except pytest.fail.Exception:
            pytest.fail(f"the restart succeeded without {victim}; the store held {held}")
    assert victim in message and "version: 2" in message, message


@pytest.mark.parametrize("mode", sorted(MODES))
def test_missing_data_file_is_restored_from_the_local_copy(spark: SparkSession, tmp_path: Path, mode: str) -> None:
    with confs(spark, localRecoveryDir=str(tmp_path / "recovery"), **MODES[mode]):
        input_dir, ckpt = first_phase(spark, tmp_path)
        delete_a_file_of_version_2(ckpt)
        run_ours(spark, input_dir, ckpt)  # the restart succeeds: this host still has the file


def worker_pids(jvm: object) -> list[int]:
    workers = jvm.org.pystatestore.StateWorker.currentWorkers()  # type: ignore[attr-defined]
    return [workers.apply(i).pid() for i in range(workers.size())]


def test_worker_killed_mid_stream_gives_exact_results(spark: SparkSession, tmp_path: Path) -> None:
    expected, _ = run_with_restart(
        spark, aggregation, provider=HDFS_PROVIDER, workdir=tmp_path / "ref", output_mode="update"
    )
    state_dir = tmp_path / "faulty" / "ckpt-PythonStateStoreProvider" / "state" / "0"
    jvm = spark._jvm
    killed: list[int] = []
    stop = threading.Event()

    def killer() -> None:
        # Kill the worker as soon as versions 2 and then 4 exist anywhere: mid-stream, often mid-commit.
        for version in (2, 4):
            while not stop.is_set() and not any(state_dir.glob(f"*/manifests/{version}.json")):
                time.sleep(0.01)
            workers = worker_pids(jvm)
            if stop.is_set() or not workers:
                return
            for pid in workers:  # every worker of the pool
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

    shutil.rmtree(tmp_path / "faulty", ignore_errors=True)
    (tmp_path / "faulty").mkdir()
    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    try:
        actual, _ = run_with_restart(
            spark, aggregation, provider=OUR_PROVIDER, workdir=tmp_path / "faulty", output_mode="update"
        )
    finally:
        stop.set()
        thread.join(10)
    assert len(killed) >= 2, f"the fault was not injected: {killed}"
    assert worker_pids(jvm) and not set(worker_pids(jvm)) & set(killed)
    assert actual == expected


def test_a_checkpoint_of_the_memory_backend_is_refused_by_the_rocksdb_backend(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A query run with backend=memory and restarted with the default backend used to carry on with
    empty state (counts from 1 again). It must stop and say which conf keeps the checkpoint usable."""
    spark.conf.set(CONF + "backend", "memory")
    try:
        input_dir, ckpt = first_phase(spark, tmp_path)
    finally:
        spark.conf.unset(CONF + "backend")
    before = snapshot_tree(ckpt / "state")
    message = restart_error(spark, input_dir, ckpt)
    assert "'memory' backend" in message and "'rocksdb' backend" in message, message
    assert CONF + "backend=memory" in message, message
    assert snapshot_tree(ckpt / "state") == before
    spark.conf.set(CONF + "backend", "memory")  # with the conf the message names, the query resumes
    try:
        run_ours(spark, input_dir, ckpt)
    finally:
        spark.conf.unset(CONF + "backend")


@pytest.mark.parametrize("form", ["absolute", "relative"])
def test_a_tampered_file_name_never_writes_outside_the_checkpoint(
    spark: SparkSession, tmp_path: Path, form: str
) -> None:
    """A manifest whose logical file name points elsewhere (absolute, or enough `..` to climb out of
    whatever local directory the worker restores into) used to make the restart write that file
    there, and then carry on without error."""
    # Snapshot commits: their manifests list file names (a changelog manifest names none).
    spark.conf.set(CONF + "localRecovery", "false")
    spark.conf.set(CONF + "commitMode", "snapshot")
    target = tmp_path / "escaped-file"
    bad_name = str(target) if form == "absolute" else "../" * 40 + str(target).lstrip("/")
    try:
        input_dir, ckpt = first_phase(spark, tmp_path)
        for m in (ckpt / "state" / "0").glob("*/manifests/2.json"):
            doc = json.loads(m.read_text())
            name, ref = next(iter(doc["private"].items()))
            del doc["private"][name]
            doc["private"][bad_name] = ref
            m.write_text(json.dumps(doc))
        message = restart_error(spark, input_dir, ckpt)
    finally:
        spark.conf.unset(CONF + "localRecovery")
        spark.conf.unset(CONF + "commitMode")
    assert not target.exists(), "a tampered manifest made the restart write outside the checkpoint"
    assert "is not a plain file name" in message and "manifests/2.json" in message, message
