"""Fault injection for tests: enabled only by the PYSTATESTORE_TEST_FAULTS environment variable,
which tests set on the processes they start, never by a Spark or pystatestore conf.

The variable holds a JSON list of rules; each applies to stores whose directory contains `store`:
    {"store": "hang-me", "point": "commit:uploaded", "action": "sleep", "seconds": 30, "times": 1}
An optional "after": n lets the point pass n times first (per worker process), so a fault can land
at a later commit than the first. An optional "once": path makes the rule fire once in all, across
the worker processes that replace each other: the first to create that file fires it. An optional
"record": path gets a line (rule index, point, action, store) appended each time the rule fires.
Actions: "sleep" (stall for `seconds`), "fail" (raise OSError), "enospc" (raise OSError ENOSPC, as a
full disk does), "exit" (the worker dies at once),
"sever" (close the connection of the JVM's call in progress, a transport error, then fail the call).
Points are the backends' fault points (commit:applied, upload:file, restore:file, gc:deleted, ...).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import threading
import time
from typing import Any

from ..store.backends import StateBackend

ENV = "PYSTATESTORE_TEST_FAULTS"
log = logging.getLogger("pystatestore.faults")
_lock = threading.Lock()
_fired: dict[int, int] = {}  # rule index -> times fired in this worker process
_passed: dict[int, int] = {}  # rule index -> times its point was reached without firing ("after")


class InjectedFaultError(OSError):
    """A failure injected by a test."""


def _rules() -> list[dict[str, Any]]:
    raw = os.environ.get(ENV)
    if not raw:
        return []
    rules = json.loads(raw)
    if not isinstance(rules, list):
        raise ValueError(f"{ENV} must hold a JSON list of rules")
    return rules


def install(backend: StateBackend) -> None:
    """Attaches the matching rules' hook to `backend`; nothing happens without the variable. Each
    rule fires at most `times` times per worker process, whichever backend instance reaches it."""
    rules = [(i, r) for i, r in enumerate(_rules()) if str(r.get("store", "")) in backend.ctx.store_dir]
    if not rules:
        return

    def hook(point: str) -> None:
        for i, rule in rules:
            if rule.get("point") != point:
                continue
            with _lock:
                if _passed.get(i, 0) < int(rule.get("after", 0)):
                    _passed[i] = _passed.get(i, 0) + 1
                    continue
                if _fired.get(i, 0) >= int(rule.get("times", 1)):
                    continue
                if "once" in rule and not _claim(str(rule["once"])):
                    continue
                _fired[i] = _fired.get(i, 0) + 1
            action = rule.get("action")
            log.warning("injecting %s at %s for store %s", action, point, backend.ctx.store_dir)
            if "record" in rule:
                with open(str(rule["record"]), "a") as record:
                    record.write(f"{i} {point} {action} {backend.ctx.store_dir}\n")
            if action == "sleep":
                time.sleep(float(rule.get("seconds", 1)))
            elif action == "fail":
                raise InjectedFaultError(f"injected failure at {point}")
            elif action == "enospc":
                raise InjectedFaultError(errno.ENOSPC, f"No space left on device (injected at {point})")
            elif action == "exit":
                os._exit(17)
            elif action == "sever":
                _sever_current_connection()
                raise InjectedFaultError(f"injected transport failure at {point}")

    backend.fault_hook = hook


def _claim(marker: str) -> bool:
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def _sever_current_connection() -> None:
    """Py4J serves each JVM call on a connection thread that owns the call's socket: shutting it
    down is what a network failure looks like to the JVM, while the worker itself lives on."""
    conn = getattr(threading.current_thread(), "socket", None)
    if conn is None:
        raise RuntimeError("'sever' needs a call from the JVM (no Py4J connection on this thread)")
    conn.shutdown(socket.SHUT_RDWR)
