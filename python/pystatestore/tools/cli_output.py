"""What every `pystatestore` command shares: the consoles it prints on, sizes and times as text,
progress bars, and opening a checkpoint so a problem ends the command with its message.

A module of its own (not cli.py, which holds the group) so the command modules can use it without
importing the module that imports them.
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from ..reading.checkpoint import SparkCheckpoint, open_checkpoint
from ..store.errors import StateStoreError

# Lines are never broken inside a message (a path must stay one word); off a terminal, tables get
# room for their columns rather than rich's default 80.
out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def size_text(n: int) -> str:
    """`n` bytes as people read them: 512 B, 1.5 KiB, ... GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def utc_text(ts: float) -> str:
    """A Unix time as a UTC date and time."""
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


class _CountColumn(ProgressColumn):
    """Bytes for downloads (`12.3/40.0 MB`), counts (`3/200`) for the rest."""

    def __init__(self) -> None:
        super().__init__()
        self._bytes, self._count = DownloadColumn(), MofNCompleteColumn()

    def render(self, task: Task) -> Text:
        return (self._bytes if task.fields.get("in_bytes") else self._count).render(task)


@contextmanager
def progress_bars(enabled: bool) -> Iterator[Any]:
    """A progress callback drawing bars on stderr when it is a terminal; silent otherwise."""
    if not enabled or not err.is_terminal:
        yield lambda what, done, total: None
        return
    with Progress(
        TextColumn("{task.description}"), BarColumn(), _CountColumn(), TimeElapsedColumn(), console=err
    ) as bars:
        tasks: dict[str, Any] = {}

        def update(what: str, done: int, total: int) -> None:
            if what not in tasks:
                tasks[what] = bars.add_task(what, total=total or None, in_bytes=what.startswith("downloading"))
            bars.update(tasks[what], completed=done, total=total or None)

        yield update


def open_or_fail(checkpoint: str) -> SparkCheckpoint:
    """The checkpoint at `checkpoint`; if it cannot be opened, the command ends with the reason."""
    try:
        return open_checkpoint(checkpoint)
    except StateStoreError as e:
        raise click.ClickException(str(e)) from None
