"""A process tree and its figures, read from /proc: what a benchmark measures of a provider's driver
JVM and every process under it (our state workers, PySpark's Python workers), and what the whole
machine's CPU did meanwhile. Every reader tolerates a process that ends while it is read."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PROC = Path("/proc")


def _stat_fields(pid: int | str) -> list[str]:
    """/proc/<pid>/stat's fields after the command name (which may hold spaces and parentheses):
    [0] is the state, [1] the parent pid, [11:15] utime, stime, cutime, cstime."""
    return (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()


def children_of() -> dict[int, list[int]]:
    """Every process's children, by parent pid."""
    tree: dict[int, list[int]] = {}
    for proc in PROC.iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = int(_stat_fields(proc.name)[1])
        except (OSError, IndexError, ValueError):
            continue
        tree.setdefault(ppid, []).append(int(proc.name))
    return tree


def subtree(root: int) -> list[int]:
    """`root` and every process under it."""
    tree, out, stack = children_of(), [], [root]
    while stack:
        pid = stack.pop()
        out.append(pid)
        stack.extend(tree.get(pid, []))
    return out


def is_java(pid: int) -> bool:
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("java")
    except OSError:
        return False


def kind_of(pid: int) -> str:
    """'jvm', 'worker' (pystatestore's state worker) or 'python' (PySpark's workers, others)."""
    if is_java(pid):
        return "jvm"
    try:
        argv = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return "python"
    return "worker" if b"pystatestore.worker" in argv else "python"


def with_args(*parts: str) -> list[int]:
    """The processes whose command line holds every one of `parts`."""
    found = []
    for proc in PROC.iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if all(p in args for p in parts):
            found.append(int(proc.name))
    return found


def rss_bytes(pid: int) -> int:
    try:
        return int((PROC / str(pid) / "statm").read_text().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def pss_bytes(pid: int) -> int:
    """Proportional set size: shared pages (libraries, the JDK's files) divided among the processes
    mapping them, which is what a container's memory limit sees of a process tree."""
    try:
        for line in (PROC / str(pid) / "smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return 0


def resident_in(pid: int, start: int, end: int) -> int:
    """Resident bytes of `pid`'s mappings inside [start, end)."""
    total, inside = 0, False
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                if "-" in line.split(" ", 1)[0] and not line.startswith(("Rss", "Size")):
                    lo, hi = (int(x, 16) for x in line.split(" ", 1)[0].split("-"))
                    inside = lo >= start and hi <= end
                elif inside and line.startswith("Rss:"):
                    total += int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return 0
    return total


@dataclass
class Usage:
    """What a set of processes holds, summed: resident memory (and the JVMs' part of it), open
    file descriptors and threads."""

    rss: int = 0
    fds: int = 0
    threads: int = 0
    jvm_rss: int = 0


def usage(pids: list[int]) -> Usage:
    """`pids`' figures from /proc/<pid>/status and fd/; a process that ends meanwhile counts for
    nothing. A process named java counts as a JVM."""
    out = Usage()
    for pid in pids:
        try:
            status = (PROC / str(pid) / "status").read_text()
            fds = len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            continue
        out.fds += fds
        is_jvm = status.startswith("Name:\tjava")
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                out.rss += int(line.split()[1]) * 1024
                out.jvm_rss += int(line.split()[1]) * 1024 if is_jvm else 0
            elif line.startswith("Threads:"):
                out.threads += int(line.split()[1])
    return out


def machine_busy_ticks() -> int:
    """CPU time the whole machine has spent busy (all cores, clock ticks), from /proc/stat."""
    fields = [int(x) for x in (PROC / "stat").read_text().splitlines()[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return user + nice + system + irq + softirq + steal


class RunTicks:
    """The CPU (clock ticks) a run's processes used between readings, counted across their ends. A
    process once seen stays in the run (a JVM orphaned when the Python process that started it
    ends still works for the run); one that ends between readings counts what it used since the
    last one through its parent's count of reaped children, where its parent is in the run (an
    orphan reaped by init loses its last interval's ticks, to other work)."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[int, int]] = {}  # pid -> (ticks with its reaped children's, parent pid)

    def since_last(self, pids: list[int]) -> int:
        """Ticks `pids` (and the run's earlier processes) used since the last call (at the first:
        in all their lives)."""
        current: dict[int, tuple[int, int]] = {}
        for pid in {*pids, *self._seen}:
            try:
                stat = _stat_fields(pid)
                current[pid] = (sum(int(x) for x in stat[11:15]), int(stat[1]))  # utime, stime, cutime, cstime
            except (OSError, IndexError, ValueError):
                continue  # ended
        used = sum(total - self._seen.get(pid, (0, 0))[0] for pid, (total, _) in current.items())
        # A reaped process's whole life is now in its parent's count; the earlier readings counted
        # all of it up to the last one.
        used -= sum(total for pid, (total, ppid) in self._seen.items() if pid not in current and ppid in current)
        self._seen = current
        return used


def own_ticks() -> int:
    """CPU time (clock ticks) this process has used itself (all its threads), without its children's."""
    stat = _stat_fields("self")
    return int(stat[11]) + int(stat[12])  # utime, stime


def cpu_seconds(stat_path: Path) -> tuple[str, float]:
    """(comm, user + system CPU seconds) of one /proc stat file (a process's or a thread's)."""
    text = stat_path.read_text()
    comm = text[text.index("(") + 1 : text.rindex(")")]
    fields = text.rsplit(")", 1)[1].split()
    return comm, (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def kill_tree(root: int, sig: int = signal.SIGKILL) -> None:
    """Signals `root` and every process under it, the deepest first."""
    for pid in reversed(subtree(root)):
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def wait_gone(pids: list[int], timeout: float) -> None:
    """Waits until none of `pids` exists any more, `timeout` seconds at most."""
    deadline = time.monotonic() + timeout
    for pid in pids:
        while (PROC / str(pid)).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
