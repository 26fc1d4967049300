"""Drivers and host set-ups for tests/test_first_error.py: a driver process of
tests/first_error_query.py that runs one query after another in one Spark session, a small tmpfs,
a cgroup v1 memory group, and directories made unwritable (and always made writable again)."""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
QUERY = ROOT / "tests" / "first_error_query.py"
READY_TIMEOUT_S = 300
CASE_TIMEOUT_S = 300


class Driver:
    """A driver process of its own (tests/first_error_query.py): one Spark session on `master` with
    `local_dir` as spark.local.dir, whose queries the test runs one at a time. Whatever a JVM caches
    (its pool of workers, a failed start, its work directory) is shared by those queries, so a
    caller that needs a JVM in which no worker has started asks `had_worker` first."""

    def __init__(self, master: str, local_dir: Path, log: Path) -> None:
        self.master = master
        self.local_dir = local_dir
        self.had_worker = False
        env = dict(os.environ)
        if env.get("PYSTATESTORE_TEST_INSTALLED") != "1":  # a source checkout: the driver imports python/
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "python"), env.get("PYTHONPATH")) if p)
        self.log = log
        self._stderr: IO[str] = open(log, "w")  # noqa: SIM115 - closed in close()
        cmd = [sys.executable, str(QUERY), "--master", master, "--conf", f"spark.local.dir={local_dir}"]
        self.process = subprocess.Popen(
            cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True
        )
        self._replies: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read_replies, daemon=True).start()
        self._reply(READY_TIMEOUT_S)

    def _read_replies(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("{"):
                self._replies.put(line)
        self._replies.put(None)

    def _reply(self, timeout_s: float) -> dict[str, Any]:
        try:
            line = self._replies.get(timeout=timeout_s)
        except queue.Empty:
            line = None
        if line is None:
            self.close()
            raise AssertionError(f"the query's driver ({self.master}) did not answer:\n{self._log_tail()}")
        return json.loads(line)

    def _log_tail(self) -> str:
        self._stderr.flush()
        return self.log.read_text(errors="replace")[-6000:]

    def run(
        self,
        checkpoint: Path,
        confs: dict[str, str],
        *,
        partitions: int = 4,
        rows: int = 1000,
        batches: int = 2,
        value_bytes: int = 0,
        starts_worker: bool = False,
    ) -> str | None:
        """Runs a query to its `batches`-th batch or its failure; what PySpark showed of the failure, or
        None. `value_bytes`: each key's state also keeps a string this long (the same for every run
        of a checkpoint). `starts_worker`: it may start a worker that works (this JVM then has one
        for good)."""
        assert self.process.poll() is None, f"the query's driver has exited:\n{self._log_tail()}"
        self.had_worker = self.had_worker or starts_worker
        case = {"checkpoint": str(checkpoint), "confs": confs, "partitions": partitions, "rows": rows}
        case |= {"value_bytes": value_bytes}
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({**case, "batches": batches, "timeout": CASE_TIMEOUT_S - 60}) + "\n")
        self.process.stdin.flush()
        error = self._reply(CASE_TIMEOUT_S)["error"]
        if error is None:
            return None
        # query.exception() is the same error without the STREAM_FAILED wrapper: it must tell the same.
        assert error["exception"] and error["exception"].split(" SQLSTATE")[0] in error["text"], error
        return error["text"]

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()  # EOF: the driver stops its session and exits
            try:
                self.process.wait(120)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._stderr.close()


def try_mount_tmpfs(path: Path, size: str) -> bool:
    """Mounts a tmpfs of `size` on the (new) directory `path`, where this user may."""
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    return mounted.returncode == 0


def unmount(path: Path) -> None:
    """Unmounts `path` once the processes that used it are gone."""
    for _ in range(50):
        if subprocess.run(["umount", str(path)], capture_output=True).returncode == 0:
            return
        time.sleep(0.2)


def memory_cgroup() -> Path | None:
    """A new cgroup v1 memory group (no limit yet), where this host lets this user make one."""
    base = Path("/sys/fs/cgroup/memory")
    if not (base / "memory.limit_in_bytes").exists() or not os.access(base, os.W_OK):
        return None
    group = base / f"pystatestore-test-{os.getpid()}-{time.monotonic_ns() % 10**8}"
    try:
        group.mkdir()
    except OSError:
        return None
    return group


def memory_stat(group: Path) -> dict[str, int]:
    """A memory group's memory.stat, by name."""
    lines = (group / "memory.stat").read_text().splitlines()
    return {name: int(value) for name, value in (line.split() for line in lines)}


def limit_memory_above_use(group: Path, headroom_bytes: int) -> int:
    """Limits a memory group to what its processes hold now plus `headroom_bytes`; the limit set.
    What they hold is their anonymous and mapped pages as the kernel charges them (a shared
    library's pages count only where no other process loaded them first), not the page cache of
    files they wrote, which the kernel would reclaim rather than kill: it reclaims it as the limit
    is set. Where it cannot reclaim enough at once, the limit is their whole use plus the headroom."""
    stat = memory_stat(group)
    held = stat.get("total_rss", stat.get("rss", 0)) + stat.get("total_mapped_file", stat.get("mapped_file", 0))
    limit = held + headroom_bytes
    try:
        (group / "memory.limit_in_bytes").write_text(str(limit))
    except OSError:  # EBUSY: the cache could not be reclaimed below the limit in time
        limit = int((group / "memory.usage_in_bytes").read_text()) + headroom_bytes
        (group / "memory.limit_in_bytes").write_text(str(limit))
    return limit


def memory_cgroup_report(group: Path, limit: int) -> str:
    """What a memory group's processes used against its limit, for a test whose kill did not come."""
    try:
        stat = memory_stat(group)
        peak = int((group / "memory.max_usage_in_bytes").read_text())
        hits = int((group / "memory.failcnt").read_text())
        procs = (group / "cgroup.procs").read_text().split()
    except OSError as e:
        return f"its memory group {group} could not be read ({e})"
    mib = {k: stat.get(k, 0) >> 20 for k in ("rss", "cache", "mapped_file")}
    return (
        f"limit {limit >> 20} MiB, peak {peak >> 20} MiB, limit reached {hits} times; now rss {mib['rss']} MiB, "
        f"page cache {mib['cache']} MiB (mapped {mib['mapped_file']} MiB); processes in it now: {procs}"
    )


def remove_cgroup(group: Path) -> bool:
    """Removes a memory group once its processes are gone; False if some are still in it after 10 s."""
    for _ in range(50):
        try:
            group.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            time.sleep(0.2)
    return False


def why_directories_stay_writable(scratch: Path) -> str | None:
    """Why `unwritable` cannot make a directory on `scratch`'s filesystem refuse new entries for this
    user, or None if it can: root is stopped only by the immutable flag, which needs chattr, the
    capability CAP_LINUX_IMMUTABLE (often dropped in containers) and a filesystem that has the flag.
    Tried on a directory of its own."""
    if os.geteuid() != 0:
        return None  # mode 0555 stops anyone but root
    if shutil.which("chattr") is None:
        return "as root only an immutable directory refuses new entries, and chattr is not installed"
    probe = scratch / "immutable-probe"
    probe.mkdir()
    try:
        with unwritable([probe]):
            try:
                (probe / "entry").touch()
            except PermissionError:
                return None
            return f"an immutable directory still takes new entries on {probe}'s filesystem"
    except subprocess.CalledProcessError as e:
        return (
            f"`chattr +i {probe}` fails here ({e.stderr.strip()}): without CAP_LINUX_IMMUTABLE, or on a "
            "filesystem without the flag, root cannot make a directory refuse new entries"
        )
    finally:
        (probe / "entry").unlink(missing_ok=True)
        probe.rmdir()


@contextmanager
def unwritable(directories: Sequence[Path]) -> Iterator[None]:
    """Makes each directory refuse new entries: immutable for root (whom modes do not stop), else
    mode 0555. On the way out, every directory it changed is restored, also when changing a later
    one failed (the error is raised after); a directory it could not restore is named."""
    as_root = os.geteuid() == 0
    changed: list[Path] = []
    try:
        for d in directories:
            if as_root:
                subprocess.run(["chattr", "+i", str(d)], check=True, capture_output=True, text=True)
            else:
                d.chmod(0o555)
            changed.append(d)
        yield
    finally:
        left: list[str] = []
        for d in changed:
            try:
                if as_root:
                    subprocess.run(["chattr", "-i", str(d)], check=True, capture_output=True, text=True)
                else:
                    d.chmod(0o755)
            except (OSError, subprocess.CalledProcessError) as e:
                left.append(f"{d} ({getattr(e, 'stderr', None) or e})")
        if left:
            raise RuntimeError(f"could not make these directories writable again, do so by hand: {'; '.join(left)}")


def directories(tree: Path) -> list[Path]:
    """`tree` and every directory under it."""
    return [tree, *sorted(p for p in tree.rglob("*") if p.is_dir())]
