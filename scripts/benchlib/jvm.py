"""What a driver JVM tells of itself: how much of its RSS is its Java heap (jcmd and its smaps),
and its GC log (each pause, and the live heap after young collections)."""

from __future__ import annotations

import datetime as dt
import math
import re
import subprocess
import threading
from pathlib import Path

from benchlib.procfs import resident_in


class HeapWatcher(threading.Thread):
    """How much of the driver JVM's RSS is its Java heap, once a second: the heap's address range
    from `jcmd GC.heap_info`, the resident pages in that range from /proc/<pid>/smaps. Committed
    heap is no measure of this: a heap committed up front (-Xms) is resident only where touched."""

    def __init__(self, jvm: int, halt: threading.Event) -> None:
        super().__init__(daemon=True)
        self.jvm, self.halt = jvm, halt
        self.resident = 0  # bytes of the heap range resident in memory

    def _heap_range(self) -> tuple[int, int] | None:
        try:
            out = subprocess.run(
                ["jcmd", str(self.jvm), "GC.heap_info"], capture_output=True, text=True, timeout=30
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            return None
        m = re.search(r"heap\s+total.*\[(0x[0-9a-f]+), (0x[0-9a-f]+)\)", out)
        return (int(m[1], 16), int(m[2], 16)) if m else None

    def run(self) -> None:
        heap = None
        while heap is None and not self.halt.wait(1.0):
            heap = self._heap_range()  # the JVM may not answer while it starts
        while heap is not None and not self.halt.is_set():
            self.resident = resident_in(self.jvm, *heap)
            self.halt.wait(1.0)


def gc_log_option(log: Path) -> str:
    """The JVM option that writes the GC log `gc_events` reads."""
    return f"-Xlog:gc:file={log}:utctime,level,tags"


GC_LINE = re.compile(r"^\[([^\]]+)\]\[info\]\[gc\] GC\(\d+\) Pause (\w+).*?(?:\d+M->(\d+)M\(\d+M\) )?([\d.]+)ms$")


def gc_events(log: Path) -> list[list[float]]:
    """[wall time, heap after the collection in MiB (young collections; NaN otherwise), pause ms] of
    every pause in a JVM's GC log (-Xlog:gc with the utctime, level and tags decorators)."""
    events: list[list[float]] = []
    if not log.exists():
        return events
    for line in log.read_text(errors="replace").splitlines():
        m = GC_LINE.match(line)
        if m is None:
            continue
        when = dt.datetime.strptime(m[1], "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()
        after = float(m[3]) if m[2] == "Young" and m[3] else math.nan
        events.append([when, after, float(m[4])])
    return events
