"""Running a child process: a benchmark starts each provider's query in a child Python process that
starts its own driver JVM, so no provider inherits another's warm JIT, page cache or loaded state.
Samplers watch the child while it runs; a child that overruns its timeout is ended with every
process under it, so no JVM or state worker outlives its run."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from benchlib import SCRIPTS
from benchlib.procfs import kill_tree


class Watcher(Protocol):
    def start(self) -> None: ...

    def stop(self) -> None: ...


@dataclass
class ChildRun:
    returncode: int
    timed_out: bool
    stdout: str  # empty where the output went to a log
    stderr: str
    seconds: float  # wall time from the start of the process to its end
    watchers: list[Watcher]  # the samplers that watched it, stopped


def run_child(
    argv: list[str],
    *,
    timeout: float | None = None,
    log: Path | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    new_session: bool = False,
    term_grace_s: float = 0.0,
    watch: Callable[[int], Sequence[Watcher]] = lambda pid: (),
) -> ChildRun:
    """Runs `python argv...` (this interpreter), its stdout and stderr captured, or both written to
    `log`. `watch(pid)` gives the samplers to run on it, started once it runs, stopped once it has
    ended. After `timeout` s the child and everything under it are killed (SIGKILL); with
    `new_session` it leads a process group of its own, which gets SIGTERM first and SIGKILL
    `term_grace_s` s later."""
    out = open(log, "w") if log is not None else subprocess.PIPE  # noqa: SIM115 - closed below
    started = time.perf_counter()
    try:
        proc = subprocess.Popen(
            [sys.executable, *argv],
            stdout=out,
            stderr=subprocess.STDOUT if log is not None else subprocess.PIPE,
            text=True,
            env=env,
            cwd=cwd,
            start_new_session=new_session,
        )
        watchers = list(watch(proc.pid))
        for w in watchers:
            w.start()
        timed_out = False
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            end_child(proc, new_session, term_grace_s)
            stdout, stderr = proc.communicate()
        finally:
            seconds = time.perf_counter() - started
            for w in watchers:
                w.stop()
    finally:
        if log is not None:
            out.close()
    return ChildRun(proc.returncode, timed_out, stdout or "", stderr or "", seconds, watchers)


def end_child(proc: subprocess.Popen, group: bool, term_grace_s: float) -> None:
    if group:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=term_grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    else:
        kill_tree(proc.pid)


def with_scripts_path(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) with scripts/ first on PYTHONPATH, so that a child started
    with `-m benchlib....` imports this package."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SCRIPTS), env.get("PYTHONPATH")) if p)
    return env


def script_argv(script: str | Path, **options: object) -> list[str]:
    """`script` and its options, for a child that parses them with argparse: option a_b becomes
    --a-b=VALUE (VALUE may start with '-'); True gives a bare flag, False or None nothing, a list one
    --a-b=X per item."""
    argv = [str(script)]
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif isinstance(value, list):
            argv += [f"{flag}={item}" for item in value]
        elif value is not None and value is not False:
            argv.append(f"{flag}={value}")
    return argv


def hidden_options(ap: argparse.ArgumentParser, *flags: str) -> None:
    """Options only a benchmark gives its children (left out of --help)."""
    for flag in flags:
        ap.add_argument(flag, help=argparse.SUPPRESS)


def result_line(stdout: str, tag: str = "RESULT ") -> str | None:
    """The payload of the last line `tag` starts in a child's output (a child prints its result so
    as its last word), or None."""
    lines = [ln for ln in stdout.splitlines() if ln.startswith(tag)]
    return lines[-1][len(tag) :] if lines else None
