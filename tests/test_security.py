"""The state workers of a real query: their Py4J control plane listens on loopback only and requires
its token (DESIGN §2), and they carry nothing they do not need. The JVM's work root, which holds the
state's rows, is this user's alone: a name no one can take first, nothing planted ever followed."""

from __future__ import annotations

import os
import re
import shutil
import socket
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from py4j.java_gateway import GatewayParameters, JavaGateway
from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

from jvm_support import plain_jvm, python_path_for_worker
from queries import aggregation
from spark_support import OUR_PROVIDER, run_with_restart, start_session

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def session_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SparkSession, list]]:
    spark = start_session("local[2]")
    run_with_restart(
        spark,
        aggregation,
        provider=OUR_PROVIDER,
        workdir=tmp_path_factory.mktemp("sec"),
        output_mode="update",
        files_per_phase=1,
    )
    pool = spark._jvm.org.pystatestore.StateWorker.currentWorkers()
    workers = [pool.apply(i) for i in range(pool.size())]
    # One per task slot (local[2]), at most one per core; the 3 shuffle partitions reach both
    assert len(workers) == min(2, os.cpu_count() or 1), "expected one state worker per task slot in this JVM"
    yield spark, workers
    spark.stop()


@pytest.fixture(params=[0, 1], ids=["worker0", "worker1"])
def worker(session_workers: tuple[SparkSession, list], request: pytest.FixtureRequest) -> tuple[SparkSession, object]:
    spark, workers = session_workers
    if request.param >= len(workers):
        pytest.skip(f"this machine's pool has {len(workers)} worker(s)")
    return spark, workers[request.param]


def listening_addresses(port: int) -> set[str]:
    """Local addresses a TCP port listens on, from /proc/net/tcp{,6} (state 0A = LISTEN)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            addr, port_hex = fields[1].rsplit(":", 1)
            if int(port_hex, 16) == port and fields[3] == "0A":
                found.add(addr)
    return found


def test_gateway_listens_on_loopback_only(worker: tuple) -> None:
    _, w = worker
    assert w.gatewayAddress() in ("127.0.0.1", "0:0:0:0:0:0:0:1")
    addrs = listening_addresses(w.gatewayPort())
    assert addrs, "gateway port not found listening"
    # 127.0.0.1, ::1 and ::ffff:127.0.0.1 (IPv4-mapped), as /proc/net/tcp{,6} spell them
    loopback = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}
    assert addrs <= loopback, f"gateway listens beyond loopback: {addrs}"


@pytest.mark.parametrize("token", [None, "not-the-token"])
def test_connection_without_the_token_is_refused(worker: tuple, token: str | None) -> None:
    _, w = worker
    intruder = JavaGateway(
        gateway_parameters=GatewayParameters(
            address="127.0.0.1", port=w.gatewayPort(), auth_token=token, auto_convert=False, eager_load=False
        )
    )
    try:
        with pytest.raises(Exception):  # noqa: B017 - py4j raises several types for a refused auth
            intruder.jvm.java.lang.System.getProperty("user.home")
    finally:
        intruder.close()
    assert w.isUsable(), "a refused intruder must not disturb the worker"


def listening_ports_of(pid: int) -> dict[int, set[str]]:
    """The TCP ports a process listens on, with their local addresses: its socket descriptors'
    inodes matched in /proc/net/tcp{,6}."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found: dict[int, set[str]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            addr, port_hex = fields[1].rsplit(":", 1)
            if fields[3] == "0A" and fields[9] in inodes:
                found.setdefault(int(port_hex, 16), set()).add(addr)
    return found


LOOPBACK_ADDRS = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}


def test_the_workers_callback_server_listens_on_loopback_only(worker: tuple) -> None:
    """The worker's callback server serves commit and maintenance (which deletes checkpoint files):
    it is the worker's only listening socket, and on loopback only."""
    _, w = worker
    ports = listening_ports_of(w.pid())
    assert len(ports) == 1, f"the worker listens on {sorted(ports)}; expected its callback server only"
    (addrs,) = ports.values()
    assert addrs <= LOOPBACK_ADDRS, f"the callback server listens beyond loopback: {addrs}"


def call_hello(port: int, preamble: bytes) -> bytes:
    """Sends `preamble`, then a Py4J call of the service's harmless `hello` on the first Python
    object the worker handed the JVM (its service, p0); returns everything the worker answers
    before it closes the connection, resets it (closing with our call unread), or 5 s pass."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(preamble + b"c\np0\nhello\ne\n")
        answer = b""
        try:
            while chunk := sock.recv(4096):
                answer += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    return answer


@pytest.mark.parametrize("preamble", [b"", b"A\nnot-the-token\ne\n"], ids=["no-token", "wrong-token"])
def test_the_workers_callback_server_refuses_a_call_without_its_token(worker: tuple, preamble: bytes) -> None:
    _, w = worker
    (port,) = listening_ports_of(w.pid())
    answer = call_hello(port, preamble)
    assert b"!ys" not in answer, f"the callback server answered a call without its token: {answer!r}"
    assert w.isUsable(), "a refused intruder must not disturb the worker"


def test_token_is_not_on_the_worker_command_line(worker: tuple) -> None:
    _, w = worker
    argv = Path(f"/proc/{w.pid()}/cmdline").read_bytes().split(b"\0")
    argv = [a.decode() for a in argv if a]
    assert argv[1:] == ["-m", "pystatestore.worker"], argv


def test_token_is_not_in_the_worker_environment(worker: tuple) -> None:
    """/proc/<pid>/environ keeps what a process started with for its whole life: the token must
    never have been there (it arrives on stdin)."""
    _, w = worker
    env = dict(
        entry.split(b"=", 1) for entry in Path(f"/proc/{w.pid()}/environ").read_bytes().split(b"\0") if b"=" in entry
    )
    assert not [k for k in env if b"TOKEN" in k.upper() or b"GATEWAY" in k.upper()], sorted(env)
    assert not [v for v in env.values() if re.fullmatch(rb"[0-9a-f]{64}", v)], (
        "a 256-bit hex secret is in the environment"
    )


def test_worker_allocators_return_freed_memory(worker: tuple) -> None:
    """Set by the shim (a user's own values are kept): with glibc's and mimalloc's defaults a worker
    keeps ~10 MiB more resident after its commits, which the JVM's RSS budget pays."""
    _, w = worker
    env = dict(
        entry.decode().split("=", 1)
        for entry in Path(f"/proc/{w.pid()}/environ").read_bytes().split(b"\0")
        if b"=" in entry
    )
    expected = {"MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": "65536", "ARROW_DEFAULT_MEMORY_POOL": "system"}
    for name, value in expected.items():
        assert env.get(name) == os.environ.get(name, value), name


def test_worker_never_loads_numpy_or_pandas(worker: tuple) -> None:
    """pyarrow imports numpy on import and pandas on a worker's first array conversion unless the
    worker keeps them out: ~13 and ~35 MiB of resident memory per worker, for nothing (the commits
    and restores above ran, changelog segments included)."""
    _, w = worker
    maps = Path(f"/proc/{w.pid()}/maps").read_text()
    loaded = sorted(
        {line.split()[-1] for line in maps.splitlines() if "/pandas/" in line or re.search(r"/numpy(\.libs)?/", line)}
    )
    assert not loaded, loaded


def test_worker_on_a_local_checkpoint_never_loads_object_store_filesystems(worker: tuple) -> None:
    """pyarrow.fs imports the S3, GCS, Azure and HDFS modules (libarrow_s3 alone ~3 MiB resident
    per worker) that a checkpoint on a local disk never uses."""
    _, w = worker
    maps = Path(f"/proc/{w.pid()}/maps").read_text()
    loaded = sorted(
        {
            line.split()[-1]
            for line in maps.splitlines()
            if re.search(r"/(libarrow_s3|_s3fs|_gcsfs|_azurefs|_hdfs)[.-]", line)
        }
    )
    assert not loaded, loaded


# The JVM's work root: each test watches a fresh JVM (the root is chosen once per JVM) without Spark,
# so the shim works in java.io.tmpdir; StateWorker.viewsDir makes the root as a store's open does.

NOBODY = 65534
NO_SUCH_PID = 2**22 + 1  # above Linux's largest pid_max: never a live process


def owner_only_dir(path: Path) -> Path:
    path.mkdir()
    path.chmod(0o700)
    return path


def chown_or_skip(path: Path, uid: int) -> None:
    try:
        os.chown(path, uid, uid)
    except PermissionError:
        pytest.skip("another owner's directory needs root to make")


def assert_owner_only_root(root: Path, pid: int) -> None:
    assert re.fullmatch(rf"pystatestore-{pid}-\d+", root.name), f"a predictable work root: {root}"
    st = root.lstat()
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid(), root
    assert stat.S_IMODE(st.st_mode) == 0o700, oct(st.st_mode)


@pytest.mark.parametrize("planted", ["wrong-mode", "symlink", "other-owner"])
def test_the_work_root_never_takes_what_was_planted_at_a_predictable_name(tmp_path: Path, planted: str) -> None:
    """Earlier releases used <tmpdir>/pystatestore-<pid>, reused as found: another user could make it
    first (readable by them, or a link to where they can read) before the JVM started a worker."""
    base, target = tmp_path / "base", owner_only_dir(tmp_path / "target")
    base.mkdir()
    with plain_jvm(base) as jvm:
        pid = jvm.java.lang.ProcessHandle.current().pid()
        old_name = base / f"pystatestore-{pid}"
        if planted == "symlink":
            old_name.symlink_to(target)
        else:
            owner_only_dir(old_name)
            if planted == "wrong-mode":
                old_name.chmod(0o755)
            else:
                chown_or_skip(old_name, NOBODY)
        root = Path(jvm.org.pystatestore.StateWorker.viewsDir().getParent())
        assert not list(target.iterdir()) and not list(old_name.iterdir()), "the planted directory was used"
        assert_owner_only_root(root, pid)
    assert not root.exists(), "the shutdown hook no longer removes the work root"
    assert old_name.is_symlink() if planted == "symlink" else old_name.is_dir(), "someone else's was removed"


def test_a_work_root_changed_under_the_jvm_is_refused(tmp_path: Path) -> None:
    """Between uses (every worker start and store open) the root is checked again: loosened, given
    away or swapped for a link, it is refused, naming it; removed (a temp cleaner), it is made anew."""
    with plain_jvm(tmp_path) as jvm:
        workers = jvm.org.pystatestore.StateWorker
        root = Path(workers.viewsDir().getParent())
        for change, undo, problem in [
            (lambda: root.chmod(0o750), lambda: root.chmod(0o700), "its mode is rwxr-x---"),
            (lambda: chown_or_skip(root, NOBODY), lambda: os.chown(root, os.getuid(), os.getgid()), "belongs to"),
            (
                lambda: (root.rename(tmp_path / "moved"), root.symlink_to(owner_only_dir(tmp_path / "elsewhere"))),
                lambda: (root.unlink(), (tmp_path / "moved").rename(root)),
                "symbolic link",
            ),
        ]:
            change()
            with pytest.raises(Py4JJavaError, match=rf"(?s){re.escape(str(root))}.*{problem}"):
                workers.viewsDir()
            undo()
            assert Path(workers.viewsDir().getParent()) == root
        assert not list((tmp_path / "elsewhere").iterdir()), "the link was followed"
        shutil.rmtree(root)
        assert Path(workers.viewsDir().getParent()) == root
        assert stat.S_IMODE(root.lstat().st_mode) == 0o700


def test_a_link_planted_where_the_next_worker_log_goes_is_never_followed(tmp_path: Path) -> None:
    """A worker's stdout and stderr are appended to its log by name: the log is created new, so a
    link (or file) found at its name stops that start, named, and nothing reaches the link's target."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"")
    with plain_jvm(tmp_path) as jvm:
        workers = jvm.org.pystatestore.StateWorker
        spec = jvm.org.pystatestore.WorkerLaunchSpec(
            sys.executable, jvm.scala.Option.apply(python_path_for_worker()), 60000, 60000, 30000, 1, "this test"
        )
        first = workers.acquire(spec, 0)
        pid, log = jvm.java.lang.ProcessHandle.current().pid(), Path(first.logFile().getPath())
        (log.parent / "worker-2.log").symlink_to(victim)
        first.kill()
        try:
            workers.acquire(spec, 0)
            refusal = "none: the worker started"
        except Py4JJavaError as e:
            refusal = str(e)
        third = workers.acquire(spec, 0)  # the next start takes the next generation's name
        third_log, third_usable = third.logFile().getName(), third.isUsable()
    # Checked once the JVM and its workers are gone: a worker's output may come after its start.
    assert victim.read_bytes() == b"", "the worker's output went through the planted link"
    assert str(log.parent / "worker-2.log") in refusal, refusal
    assert third_log == "worker-3.log" and third_usable
    assert_owner_only_root(log.parent, pid)  # kept, with the logs: a worker was killed
    assert stat.S_ISREG(log.lstat().st_mode) and stat.S_IMODE(log.lstat().st_mode) == 0o600


def test_the_sweep_removes_only_work_roots_of_ours(tmp_path: Path) -> None:
    """Roots of JVMs that are gone, untouched for an hour, are removed by the next JVM's first use of
    the same base: only a directory of this user with mode 0700, named like a root. Never a link's
    target, another user's directory, a looser one, a live JVM's nor local recovery's."""
    hour_ago = time.time() - 3700
    # Ours, and an earlier release's (pystatestore-<pid>)
    gone = [
        owner_only_dir(tmp_path / f"pystatestore-{NO_SUCH_PID}-1"),
        owner_only_dir(tmp_path / f"pystatestore-{NO_SUCH_PID}"),
    ]
    target = owner_only_dir(tmp_path / "target")
    kept = {
        "recent": owner_only_dir(tmp_path / f"pystatestore-{NO_SUCH_PID}-2"),
        "live JVM": owner_only_dir(tmp_path / f"pystatestore-{os.getpid()}-3"),
        "looser": owner_only_dir(tmp_path / f"pystatestore-{NO_SUCH_PID}-4"),
        "another user's": owner_only_dir(tmp_path / f"pystatestore-{NO_SUCH_PID}-5"),
        "local recovery": owner_only_dir(tmp_path / "pystatestore-local-recovery-0"),
        "link's target": target,
    }
    (tmp_path / f"pystatestore-{NO_SUCH_PID}-6").symlink_to(target)
    kept["looser"].chmod(0o755)
    for d in [*gone, *kept.values()]:
        (d / "worker-1.log").write_text("rows")
    chown_or_skip(kept["another user's"], NOBODY)
    for d in [*gone, *kept.values()]:
        if d != kept["recent"]:
            os.utime(d, (hour_ago, hour_ago))
    os.utime(tmp_path / f"pystatestore-{NO_SUCH_PID}-6", (hour_ago, hour_ago), follow_symlinks=False)
    with plain_jvm(tmp_path) as jvm:
        jvm.org.pystatestore.StateWorker.viewsDir()
        assert not [d.name for d in gone if d.exists()], "a gone JVM's root was not swept"
        assert {what: d.name for what, d in kept.items() if not (d / "worker-1.log").exists()} == {}
