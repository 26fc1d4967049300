"""The first error a user sees names the cause and the fix (issue 69): each failure a user can
cause by setup, in a real query started by hand (tests/first_error_query.py), judged on the text
PySpark shows.

What a JVM caches decides which causes may share a driver (StateWorker.scala): its pool of
workers, which serves every later query whatever interpreter that query asks for; a failed start,
given for 30 s to every store that asks with the same interpreter and path; its work directory,
made once in spark.local.dir. So two drivers serve every case, each started once for the module (a
JVM start and its first query cost 20-50 s, a further query 2-7 s):

- `cluster`, local-cluster[2,1,1024] (two executor JVMs; the error crosses from an executor to the
  driver as on a cluster), with spark.local.dir on an 8 MiB tmpfs where this user may mount one. No
  worker works in it until its last case (the full disk): each start failure before is a query's
  own, as each asks with an interpreter of its own.
- `local`, local[2]: first what needs a JVM in which no worker has started (the issue's case, then
  the OOM kill, which starts one), then what needs a working worker (the restart case's checkpoint,
  the unwritable checkpoint).

A case that needs a JVM without a working worker gets a new driver if its own has had one (pytest's
order never needs that). The words for each kind of interpreter, missing module and OOM kill (cgroup
v1 and v2) are judged in jvm-shim/src/test/scala/org/pystatestore/WorkerDiagnosisSuite.scala; here
each case proves its kind of failure reaches what PySpark shows:
- an interpreter that does not exist, or is not executable: the JVM cannot run it
  (WorkerProcess.start), in a commit (`CANNOT_WRITE_STATE_STORE.CANNOT_COMMIT`);
- a Python without pystatestore (the issue's case: 200 partitions): the worker exits before it
  registers, in a commit; one start per JVM: on local[2] two tasks, each with a worker slot of its
  own, ask at once (taking out the rule that slots start one at a time until one has started makes
  two); on local-cluster every later task and retry of an executor gets its failed start (taking
  out the memory of failed starts makes 3 on local[2], about 10 per executor);
- a restart whose worker cannot start: the same text through a load (`CANNOT_LOAD_STATE_STORE`);
- a worker of another release: it starts and is refused at the handshake;
- a worker the kernel's OOM killer kills in a cgroup v1 memory group (where this user may make one):
  a worker that died in a call, told by its cgroup's counter;
- a full local disk (the tmpfs): the JVM's or the worker's side of a commit names the local work
  directory, never the checkpoint;
- a store's directory in the checkpoint made unwritable: the worker's error on the checkpoint.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import pystatestore
from first_error_support import (
    Driver,
    directories,
    limit_memory_above_use,
    memory_cgroup,
    memory_cgroup_report,
    remove_cgroup,
    try_mount_tmpfs,
    unmount,
    unwritable,
    why_directories_stay_writable,
)
from pystatestore.release import __version__

CONF = "spark.sql.streaming.stateStore.pystatestore."
PACKAGE_PARENT = str(Path(pystatestore.__file__).resolve().parent.parent)
GOOD_WORKER = {f"{CONF}pythonExec": sys.executable, f"{CONF}pythonPath": PACKAGE_PARENT}
CLUSTER = "local-cluster[2,1,1024]"
SMALL_DISK = "8m"


class Drivers:
    """The module's drivers (see the module's docstring), started when first asked for."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.started: dict[str, Driver] = {}
        self.small_disks: list[Path] = []
        self.count = 0

    def _new(self, kind: str) -> Driver:
        self.retire(kind)
        self.count += 1
        local_dir = self.base / f"{kind}-{self.count}"
        if kind == "cluster" and try_mount_tmpfs(local_dir, SMALL_DISK):
            self.small_disks.append(local_dir)
        else:
            local_dir.mkdir(exist_ok=True)
        master = CLUSTER if kind == "cluster" else "local[2]"
        self.started[kind] = Driver(master, local_dir, self.base / f"{kind}-{self.count}.log")
        return self.started[kind]

    def retire(self, kind: str) -> None:
        """Stops the driver of `kind`, if one is running; the next case of that kind starts another."""
        driver = self.started.pop(kind, None)
        if driver is not None:
            driver.close()

    def get(self, kind: str, *, without_worker: bool = False) -> Driver:
        driver = self.started.get(kind)
        if driver is None or (without_worker and driver.had_worker):
            driver = self._new(kind)
        return driver

    def close(self) -> None:
        for driver in self.started.values():
            driver.close()
        for disk in self.small_disks:
            unmount(disk)


@pytest.fixture(scope="module")
def drivers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Drivers]:
    started = Drivers(tmp_path_factory.mktemp("first-error-drivers"))
    try:
        yield started
    finally:
        started.close()


def shown(text: str | None) -> str:
    """The query's error as PySpark shows it, up to its plan (which says nothing of the cause)."""
    assert text is not None, "the query did not fail"
    return text.split("=== Streaming Query ===")[0]


def worker_logs(local_dir: Path) -> set[tuple[str, str]]:
    """Worker logs in the JVMs' work roots (`pystatestore-<pid>-*`) under spark.local.dir."""
    return {(root.name, log.name) for root in local_dir.glob("pystatestore-*-*") for log in root.glob("worker-*.log")}


def no_site_python(tmp_path: Path) -> Path:
    """An interpreter without pystatestore (nor anything else installed): this Python without its
    site-packages. Each test's own path, so no other case's failed start is remembered for it."""
    python = tmp_path / "bare-python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    python.chmod(0o755)
    return python


@pytest.mark.spark
@pytest.mark.cluster
def test_a_missing_interpreter_is_named(tmp_path: Path, drivers: Drivers) -> None:
    missing = tmp_path / "no-such-env" / "bin" / "python3"
    driver = drivers.get("cluster", without_worker=True)
    text = shown(driver.run(tmp_path / "ckpt", {f"{CONF}pythonExec": str(missing)}))
    assert "[CANNOT_WRITE_STATE_STORE.CANNOT_COMMIT]" in text
    assert f"the Python interpreter set by {CONF}pythonExec is unusable: '{missing}' does not exist" in text, text


@pytest.mark.spark
@pytest.mark.cluster
def test_an_interpreter_that_cannot_be_run_is_named(tmp_path: Path, drivers: Drivers) -> None:
    # Not executable even by root: no execute bit at all.
    python = tmp_path / "python3"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python.chmod(stat.S_IRUSR | stat.S_IWUSR)
    driver = drivers.get("cluster", without_worker=True)
    text = shown(driver.run(tmp_path / "ckpt", {f"{CONF}pythonExec": str(python)}))
    assert f"'{python}' is not executable by this user" in text, text


@pytest.mark.spark
@pytest.mark.parametrize("kind", ["local", "cluster"], ids=["local[2]", CLUSTER])
def test_a_python_without_pystatestore_is_named_once_per_jvm(tmp_path: Path, drivers: Drivers, kind: str) -> None:
    """The issue's case: 200 partitions, an interpreter without the package. Every JVM starts one
    worker, not one per store: on local[2] two tasks, each with a worker slot of its own, ask at
    once (the first start's outcome is waited for); on local-cluster every task after the first on
    each executor JVM, and every retry, gets that JVM's failed start. The text says which package is
    missing and how to install it."""
    python = no_site_python(tmp_path)
    driver = drivers.get(kind, without_worker=True)
    logs_before = worker_logs(driver.local_dir)
    text = shown(driver.run(tmp_path / "ckpt", {f"{CONF}pythonExec": str(python)}, partitions=200))
    assert "[CANNOT_WRITE_STATE_STORE.CANNOT_COMMIT]" in text
    assert f"('{python} -m pystatestore.worker', the Python set by {CONF}pythonExec)" in text, text
    assert "exited with code 1 before registering: that Python cannot import pystatestore" in text, text
    assert f"'{python}' -m pip install pystatestore=={__version__}" in text, text
    starts: dict[str, list[str]] = {}
    for root, log in worker_logs(driver.local_dir) - logs_before:
        starts.setdefault(root, []).append(log)
    assert starts and all(len(logs) == 1 for logs in starts.values()), starts


@pytest.mark.spark
@pytest.mark.cluster
def test_another_release_is_refused_naming_both(tmp_path: Path, drivers: Drivers) -> None:
    other = tmp_path / "other-release"
    shutil.copytree(Path(pystatestore.__file__).resolve().parent, other / "pystatestore")
    release = other / "pystatestore" / "release.py"
    release.write_text(release.read_text().replace(f'"{__version__}"', '"0.4.9"'))
    confs = {f"{CONF}pythonExec": sys.executable, f"{CONF}pythonPath": str(other)}
    text = shown(drivers.get("cluster", without_worker=True).run(tmp_path / "ckpt", confs))
    assert "runs pystatestore 0.4.9 (protocol " in text, text
    assert f"but this jar is pystatestore {__version__}" in text, text
    assert f"-m pip install pystatestore=={__version__}" in text, text


@pytest.mark.spark
def test_a_worker_killed_for_memory_is_named_with_its_memory(tmp_path: Path, drivers: Drivers) -> None:
    """The kernel's out-of-memory killer, for real: the one worker of the one store runs in a memory
    cgroup (as in an executor container) whose limit, once the worker has started and committed a
    first batch, is set 4 MiB above the pages it holds (not the page cache of files it wrote, which
    the kernel reclaims rather than kill); the restart's batch of 40k keys, each keeping 1 KiB, does
    not fit: the worker holds one batch of the JVM's change frame (32,768 rows) at a time, 65 MiB
    above its use here. (A fixed limit would depend on what the kernel charges the group: a shared
    library's pages count only where no other process loaded them first. Keys of a count alone, 16
    bytes, once fit the headroom on CI: a frame batch of them is about 1 MiB.)"""
    group = memory_cgroup()
    if group is None:
        pytest.skip(
            "this host does not let this user make a cgroup v1 memory group; the words for a kill counted "
            "by cgroup v1 or v2 are judged in jvm-shim/src/test/scala/org/pystatestore/WorkerDiagnosisSuite.scala"
        )
    try:
        python = tmp_path / "limited-python"
        python.write_text(f'#!/bin/sh\necho $$ > {group}/cgroup.procs\nexec {sys.executable} "$@"\n')
        python.chmod(0o755)
        confs = {f"{CONF}pythonExec": str(python), f"{CONF}pythonPath": PACKAGE_PARENT}
        driver = drivers.get("local", without_worker=True)  # else a live worker would take the store
        ckpt = tmp_path / "ckpt"
        wide = 1024
        assert driver.run(ckpt, confs, partitions=1, batches=1, value_bytes=wide, starts_worker=True) is None
        limit = limit_memory_above_use(group, 4 << 20)
        outcome = driver.run(ckpt, confs, rows=40_000, batches=3, value_bytes=wide)
        if outcome is None:
            pytest.fail(f"the worker was not killed: {memory_cgroup_report(group, limit)}")
        text = shown(outcome)
    finally:
        # Its one process is gone once it is killed; one that was not goes with its driver.
        if not remove_cgroup(group):
            drivers.retire("local")
            remove_cgroup(group)
    assert f"died, killed by the kernel's out-of-memory killer (exit code 137; its memory cgroup /{group.name} " in text
    assert "its resident memory was last seen at " in text, text
    assert "spark.executor.memoryOverhead" in text, text


@pytest.mark.spark
@pytest.mark.cluster
def test_a_restart_whose_worker_cannot_start_fails_its_load_with_the_same_text(
    tmp_path: Path, drivers: Drivers
) -> None:
    ckpt = tmp_path / "ckpt"
    assert drivers.get("local").run(ckpt, GOOD_WORKER, batches=1, starts_worker=True) is None
    python = no_site_python(tmp_path)
    driver = drivers.get("cluster", without_worker=True)
    text = shown(driver.run(ckpt, {f"{CONF}pythonExec": str(python)}, batches=2))
    assert "[CANNOT_LOAD_STATE_STORE.UNCATEGORIZED]" in text, text
    assert "that Python cannot import pystatestore" in text, text


@pytest.mark.spark
def test_an_unwritable_checkpoint_is_named(tmp_path: Path, drivers: Drivers) -> None:
    why = why_directories_stay_writable(tmp_path)
    if why is not None:
        pytest.skip(why)
    driver = drivers.get("local")
    ckpt = tmp_path / "ckpt"
    assert driver.run(ckpt, GOOD_WORKER, starts_worker=True) is None
    store = ckpt / "state" / "0" / "0"
    with unwritable(directories(store)):
        # A restart of the query in the same JVM: its worker serves on, the store's directory refuses.
        text = shown(driver.run(ckpt, GOOD_WORKER, batches=4))
    assert "[CANNOT_WRITE_STATE_STORE.CANNOT_COMMIT]" in text, text
    assert "the checkpoint location cannot be written (" in text, text
    assert f"make {store} writable by the user that runs Spark's executors" in text, text


@pytest.mark.spark
@pytest.mark.cluster
def test_a_full_local_disk_is_named(tmp_path: Path, drivers: Drivers) -> None:
    """Last of the cluster driver's cases: it starts workers that work, and fills its disk."""
    driver = drivers.get("cluster", without_worker=True)
    if driver.local_dir not in drivers.small_disks:
        pytest.skip("this user cannot mount a small tmpfs")
    text = shown(driver.run(tmp_path / "ckpt", GOOD_WORKER, rows=300_000, batches=4, starts_worker=True))
    # Where it runs out differs from run to run (the JVM's change frame, the local database, a
    # segment): each says it is this host's local work directory, never the checkpoint.
    assert "No space left on device" in text, text
    assert "local work directory is full" in text and "set spark.local.dir to a directory on a larger disk" in text
    assert "damaged" not in text and "checkpoint's file system" not in text, text


def test_unwritable_restores_every_directory_it_changed_when_a_later_one_fails(tmp_path: Path) -> None:
    """The helper above: a directory it could not change (here, one that does not exist) fails it,
    and the one it changed before is writable again; while in effect, a directory refuses entries."""
    why = why_directories_stay_writable(tmp_path)
    if why is not None:
        pytest.skip(why)
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    with unwritable([first, second]):
        for d in (first, second):
            with pytest.raises(PermissionError):
                (d / "entry").touch()
    with pytest.raises((subprocess.CalledProcessError, FileNotFoundError)):
        with unwritable([first, tmp_path / "never-made", second]):
            pytest.fail("entered although a directory could not be made unwritable")
    for d in (first, second):
        (d / "entry").touch()  # writable again (or never changed)
    if os.geteuid() == 0:
        flags = subprocess.run(["lsattr", "-d", str(first)], capture_output=True, text=True, check=True).stdout
        assert "i" not in flags.split()[0], flags
