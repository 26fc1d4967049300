"""Threads that sample /proc while a benchmark runs: the peak memory of a child's driver JVM and
every process under it, and the machine's load (CPU that other work used), so a reader can tell a
noisy run."""

from __future__ import annotations

import math
import os
import statistics
import threading
import time
from collections.abc import Callable

from benchlib.jvm import HeapWatcher
from benchlib.procfs import (
    CLOCK_TICKS,
    RunTicks,
    children_of,
    is_java,
    kind_of,
    machine_busy_ticks,
    own_ticks,
    pss_bytes,
    rss_bytes,
    subtree,
)


class Sampler(threading.Thread):
    """Calls `sample()` every `interval` seconds (first at the start when `at_start`) until `stop()`."""

    interval = 1.0
    at_start = False

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.halt = threading.Event()

    def run(self) -> None:
        if self.at_start:
            self.sample()
        while not self.halt.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        self.halt.set()
        self.join()


class MemorySampler(Sampler):
    """Every 100 ms: the RSS and PSS of the JVMs started by `parent` (a child process) and all their
    descendants; keeps the peak, how it split between the JVM, pystatestore's worker and other
    processes, the peak of each phase (`phase()` names the current one) and the driver JVM's
    resident heap at the peak (up to a second old) against the rest of its RSS (metaspace, code,
    threads, direct buffers, native libraries)."""

    interval = 0.1
    at_start = True

    def __init__(self, parent: int, phase: Callable[[], str] = lambda: "run", phases: tuple[str, ...] = ("run",)):
        super().__init__()
        self.parent, self.phase = parent, phase
        self.peak = 0
        self.peak_split: dict[str, int] = {}
        self.phase_peaks = dict.fromkeys(phases, 0)
        self.phase_splits: dict[str, dict[str, int]] = {p: {} for p in phases}
        self.peak_pss = 0
        self.heap_at_peak = 0
        self.outside_heap_at_peak = 0
        self.heaps: dict[int, HeapWatcher] = {}

    def sample(self) -> None:
        # The driver JVM is a direct child of the bench's child process (spark-submit execs java).
        jvms = [p for p in children_of().get(self.parent, []) if is_java(p)]
        split: dict[str, int] = {}
        pss = 0
        for jvm in jvms:
            if jvm not in self.heaps:
                self.heaps[jvm] = HeapWatcher(jvm, self.halt)
                self.heaps[jvm].start()
            for p in subtree(jvm):
                kind = kind_of(p)
                if p != jvm and kind == "jvm":
                    # A child of the JVM that still looks like a JVM is one being spawned (it
                    # shares the JVM's memory until it execs): counting it would double the JVM.
                    continue
                split[kind] = split.get(kind, 0) + rss_bytes(p)
                pss += pss_bytes(p)
        total = sum(split.values())
        phase = self.phase()
        if total > self.phase_peaks.get(phase, 0):
            self.phase_peaks[phase], self.phase_splits[phase] = total, split
        if total > self.peak:
            self.peak, self.peak_split = total, split
            heap = sum(self.heaps[j].resident for j in jvms)
            self.heap_at_peak = heap
            self.outside_heap_at_peak = max(split.get("jvm", 0) - heap, 0) if heap else 0
        self.peak_pss = max(self.peak_pss, pss)


class CpuLoad:
    """The CPU the rest of the machine used between two readings, in cores: the machine's busy
    ticks (/proc/stat) less those of the run's processes and of this process itself (the bench's
    own samplers), which is reported apart. Above a few percent of a core, other work competed
    with the run and its timings say less."""

    def __init__(self) -> None:
        self.run = RunTicks()
        self._last: tuple[float, int, int] | None = None  # (time, machine busy, this process)

    def read(self, run_pids: list[int]) -> tuple[float, float]:
        """(other cores, this process's cores) since the last reading; NaN at the first. This
        process may be among `run_pids`: then its children's count as the run's, its own apart."""
        now, busy, own = time.time(), machine_busy_ticks(), own_ticks()
        ran = self.run.since_last(run_pids)
        other = own_cores = math.nan
        if self._last is not None:
            t0, busy0, own0 = self._last
            if os.getpid() in run_pids:
                ran -= own - own0
            elapsed = max(now - t0, 1e-9) * CLOCK_TICKS
            own_cores = (own - own0) / elapsed
            other = max(0, (busy - busy0) - ran - (own - own0)) / elapsed
        self._last = (now, busy, own)
        return other, own_cores


# Other work on the machine, in cores, above which a sample's timings are marked as disturbed.
OTHER_CPU_LIMIT = 0.1


class LoadMonitor(Sampler):
    """The machine's load through a whole benchmark, every 5 s: the CPU other work used (all but
    this process and its children, see CpuLoad) and the load average. `phase` names what runs now
    (a provider), so the report can say which run a disturbance fell in."""

    interval = 5.0
    at_start = True

    def __init__(self) -> None:
        super().__init__()
        self.cpu = CpuLoad()
        self.phase = ""
        self.samples: list[tuple[str, float, float, float]] = []  # (phase, other cores, own cores, load average)

    def sample(self) -> None:
        other, own = self.cpu.read(subtree(os.getpid()))
        if not math.isnan(other):
            self.samples.append((self.phase, other, own, os.getloadavg()[0]))

    def stop(self) -> None:
        super().stop()
        self.sample()  # the last few seconds too

    def summary(self) -> str:
        """One line: other work's CPU (mean, peak, per phase), the load average, the bench's own."""
        if not self.samples:
            return "not measured (the run was shorter than a sample)"
        others = [s[1] for s in self.samples]
        busy = sum(1 for o in others if o > OTHER_CPU_LIMIT)
        verdict = (
            f"quiet: never above {OTHER_CPU_LIMIT:g}"
            if not busy
            else f"NOISY: above {OTHER_CPU_LIMIT:g} in {busy} of {len(others)} samples: other work competed"
        )
        phases = list(dict.fromkeys(s[0] for s in self.samples if s[0]))
        by_phase = ", ".join(f"{p} {statistics.mean(s[1] for s in self.samples if s[0] == p):.2f}" for p in phases)
        loads = [s[3] for s in self.samples]
        return (
            f"other work on the machine used {statistics.mean(others):.2f} cores on average, {max(others):.2f} at most "
            f"in {self.interval:g} s ({verdict})"
            + (f"; by run: {by_phase}" if by_phase else "")
            + f"; load average {min(loads):.1f}-{max(loads):.1f}; this bench's own process (its samplers) "
            f"{statistics.mean(s[2] for s in self.samples):.2f} cores"
        )
