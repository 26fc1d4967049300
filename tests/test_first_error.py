"""The first error a user sees names the cause and the fix (issue 69): each failure a user can
cause by setup, in a real query started by hand (tests/first_error_query.py, a driver of its own,
so every case starts from a JVM with no worker yet), judged on the text PySpark shows."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import pystatestore
from pystatestore.release import __version__

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parent.parent
QUERY = ROOT / "tests" / "first_error_query.py"
CONF = "spark.sql.streaming.stateStore.pystatestore."
PACKAGE_PARENT = str(Path(pystatestore.__file__).resolve().parent.parent)
GOOD_WORKER = [f"{CONF}pythonExec={sys.executable}", f"{CONF}pythonPath={PACKAGE_PARENT}"]


def run_query(checkpoint: Path, confs: list[str], *, master: str = "local[2]", **options: int) -> str | None:
    """Runs the query in a driver of its own; what PySpark showed of its failure, or None."""
    env = dict(os.environ)
    if env.get("PYSTATESTORE_TEST_INSTALLED") != "1":  # a source checkout: the driver imports python/
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "python"), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, str(QUERY), "--checkpoint", str(checkpoint), "--master", master]
    for name, value in options.items():
        cmd += [f"--{name}", str(value)]
    for conf in confs:
        cmd += ["--conf", conf]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=420)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, f"the query's driver failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    error = json.loads(lines[-1])["error"]
    if error is None:
        return None
    # query.exception() is the same error without the STREAM_FAILED wrapper: it must tell the same.
    assert error["exception"] and error["exception"].split(" SQLSTATE")[0] in error["text"], error
    return error["text"]


def shown(text: str | None) -> str:
    """The query's error as PySpark shows it, up to its plan (which says nothing of the cause)."""
    assert text is not None, "the query did not fail"
    return text.split("=== Streaming Query ===")[0]


def worker_logs(local_dir: Path) -> dict[str, list[str]]:
    """Worker logs left per JVM work root (`pystatestore-<pid>-*`) under spark.local.dir."""
    return {root.name: sorted(p.name for p in root.glob("worker-*.log")) for root in local_dir.glob("pystatestore-*-*")}


def test_a_missing_interpreter_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-env" / "bin" / "python3"
    text = shown(run_query(tmp_path / "ckpt", [f"{CONF}pythonExec={missing}"], partitions=4))
    assert "[CANNOT_WRITE_STATE_STORE.CANNOT_COMMIT]" in text
    assert f"the Python interpreter set by {CONF}pythonExec is unusable: '{missing}' does not exist" in text, text


def test_an_interpreter_that_cannot_be_run_is_named(tmp_path: Path) -> None:
    # Not executable even by root: no execute bit at all.
    python = tmp_path / "python3"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python.chmod(stat.S_IRUSR | stat.S_IWUSR)
    text = shown(run_query(tmp_path / "ckpt", [f"{CONF}pythonExec={python}"], partitions=4))
    assert f"'{python}' is not executable by this user" in text, text


def no_site_python(tmp_path: Path) -> Path:
    """An interpreter without pystatestore (nor anything else installed): this Python without its
    site-packages."""
    python = tmp_path / "bare-python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    python.chmod(0o755)
    return python


@pytest.mark.parametrize("master", ["local[2]", "local-cluster[2,1,1024]"])
def test_a_python_without_pystatestore_is_named_once_per_jvm(tmp_path: Path, master: str) -> None:
    """The issue's case: 200 partitions, an interpreter without the package. Every JVM starts one
    worker, not one per partition, and the text says which package is missing and how to install it."""
    local_dir = tmp_path / "local"
    local_dir.mkdir()
    python = no_site_python(tmp_path)
    confs = [f"{CONF}pythonExec={python}", f"spark.local.dir={local_dir}"]
    text = shown(run_query(tmp_path / "ckpt", confs, master=master, partitions=200))
    assert "[CANNOT_WRITE_STATE_STORE.CANNOT_COMMIT]" in text
    assert f"('{python} -m pystatestore.worker', the Python set by {CONF}pythonExec)" in text, text
    assert "exited with code 1 before registering: that Python cannot import pystatestore" in text, text
    assert f"'{python}' -m pip install pystatestore=={__version__}" in text, text
    starts = worker_logs(local_dir)
    assert starts and all(len(logs) == 1 for logs in starts.values()), starts


def test_a_restart_whose_worker_cannot_start_fails_its_load_with_the_same_text(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    assert run_query(ckpt, GOOD_WORKER, partitions=4) is None
    python = no_site_python(tmp_path)
    text = shown(run_query(ckpt, [f"{CONF}pythonExec={python}"], partitions=4, batches=4))
    assert "[CANNOT_LOAD_STATE_STORE.UNCATEGORIZED]" in text, text
    assert "that Python cannot import pystatestore" in text, text


def test_another_release_is_refused_naming_both(tmp_path: Path) -> None:
    other = tmp_path / "other-release"
    shutil.copytree(Path(pystatestore.__file__).resolve().parent, other / "pystatestore")
    release = other / "pystatestore" / "release.py"
    release.write_text(release.read_text().replace(f'"{__version__}"', '"0.4.9"'))
    confs = [f"{CONF}pythonExec={sys.executable}", f"{CONF}pythonPath={other}"]
    text = shown(run_query(tmp_path / "ckpt", confs, partitions=4))
    assert "runs pystatestore 0.4.9 (protocol " in text, text
    assert f"but this jar is pystatestore {__version__}" in text, text
    assert f"-m pip install pystatestore=={__version__}" in text, text


def memory_cgroup(limit_bytes: int) -> Path | None:
    """A new cgroup v1 memory group with `limit_bytes`, where this host lets us make one."""
    base = Path("/sys/fs/cgroup/memory")
    if not (base / "memory.limit_in_bytes").exists() or not os.access(base, os.W_OK):
        return None
    group = base / f"pystatestore-test-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(limit_bytes))
    except OSError:
        return None
    return group


def test_a_worker_killed_for_memory_is_named_with_its_memory(tmp_path: Path) -> None:
    """The kernel's out-of-memory killer, for real: the worker runs in a memory cgroup of 90 MiB
    (as in an executor container's limit) and a batch of 3M keys does not fit."""
    group = memory_cgroup(90 << 20)
    if group is None:
        pytest.skip("this host does not let this user make a cgroup v1 memory group")
    try:
        python = tmp_path / "limited-python"
        python.write_text(f'#!/bin/sh\necho $$ > {group}/cgroup.procs\nexec {sys.executable} "$@"\n')
        python.chmod(0o755)
        confs = [f"{CONF}pythonExec={python}", f"{CONF}pythonPath={PACKAGE_PARENT}"]
        text = shown(run_query(tmp_path / "ckpt", confs, partitions=2, rows=3_000_000))
    finally:
        for _ in range(50):  # its processes are gone once the query's JVM is
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.2)
    assert f"died, killed by the kernel's out-of-memory killer (exit code 137; its memory cgroup /{group.name} " in text
    assert "its resident memory was last seen at " in text, text
    assert "spark.executor.memoryOverhead" in text, text


@contextmanager
def small_disk(path: Path, size: str) -> Iterator[bool]:
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    try:
        yield mounted.returncode == 0
    finally:
        if mounted.returncode == 0:
            for _ in range(50):
                if subprocess.run(["umount", str(path)], capture_output=True).returncode == 0:
                    break
                time.sleep(0.2)


def test_a_full_local_disk_is_named(tmp_path: Path) -> None:
    with small_disk(tmp_path / "small", "8m") as mounted:
        if not mounted:
            pytest.skip("this user cannot mount a small tmpfs")
        confs = [*GOOD_WORKER, f"spark.local.dir={tmp_path / 'small'}"]
        text = shown(run_query(tmp_path / "ckpt", confs, partitions=4, rows=300_000, batches=4))
    # Where it runs out differs from run to run (the JVM's change frame, the local database, a
    # segment): each says it is this host's local work directory, never the checkpoint.
    assert "No space left on device" in text, text
    assert "local work directory is full" in text and "set spark.local.dir to a directory on a larger disk" in text
    assert "damaged" not in text and "checkpoint's file system" not in text, text


@contextmanager
def unwritable(tree: Path) -> Iterator[None]:
    """Makes every directory of `tree` refuse new entries: immutable for root (whom modes do not
    stop), else mode 0555."""
    dirs = [tree, *(p for p in tree.rglob("*") if p.is_dir())]
    as_root = os.geteuid() == 0
    for d in dirs:
        if as_root:
            subprocess.run(["chattr", "+i", str(d)], check=True)
        else:
            d.chmod(0o555)
    try:
        yield
    finally:
        for d in dirs:
            if as_root:
                subprocess.run(["chattr", "-i", str(d)], check=True)
            else:
                d.chmod(0o755)


def test_an_unwritable_checkpoint_is_named(tmp_path: Path) -> None:
    if os.geteuid() == 0 and shutil.which("chattr") is None:
        pytest.skip("as root only an immutable directory refuses writes, and chattr is missing")
    ckpt = tmp_path / "ckpt"
    assert run_query(ckpt, GOOD_WORKER, partitions=4) is None
    store = ckpt / "state" / "0" / "0"
    with unwritable(store):
        text = shown(run_query(ckpt, GOOD_WORKER, partitions=4, batches=4))
    assert "[CANNOT_WRITE_STATE_STORE.CANNOT_COMMIT]" in text, text
    assert "the checkpoint location cannot be written (" in text, text
    assert f"make {store} writable by the user that runs Spark's executors" in text, text
