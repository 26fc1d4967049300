"""The Spark-facing service: the object the JVM shim calls over Py4J (PythonStateService).

It maps store handles to backends, serialises calls per store, and turns every failure into a JSON
error reply, so the JVM can tell "the worker said no" from "the worker died".
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from . import frames
from .backends import BACKENDS, DEFAULT_BACKEND, StateBackend, StoreContext
from .errors import StateStoreError, StoreConfigError
from .remote import RemoteStore

PROTOCOL_VERSION = 1
DEFAULT_ORPHAN_GRACE_SECONDS = 600.0
log = logging.getLogger("pystatestore.service")


def context_from_description(desc: dict[str, Any]) -> StoreContext:
    options = {str(k): str(v) for k, v in desc.get("options", {}).items()}
    store = str(desc["storeDir"])
    try:
        grace = float(options.get("orphanGraceSeconds", DEFAULT_ORPHAN_GRACE_SECONDS))
    except ValueError:
        raise StoreConfigError(
            f"orphanGraceSeconds={options['orphanGraceSeconds']!r} is not a number", store=store
        ) from None
    return StoreContext(
        store_dir=store,
        operator_id=int(desc["operatorId"]),
        partition_id=int(desc["partitionId"]),
        store_name=str(desc["storeName"]),
        key_schema=str(desc["keySchema"]),
        value_schema=str(desc["valueSchema"]),
        min_versions_to_retain=int(desc["minVersionsToRetain"]),
        orphan_grace_seconds=grace,
        options=options,
        local_dir=str(desc.get("localDir", "")),
    )


def make_backend(ctx: StoreContext) -> StateBackend:
    name = ctx.options.get("backend", DEFAULT_BACKEND)
    cls = BACKENDS.get(name)
    if cls is None:
        raise StoreConfigError(f"unknown backend {name!r} (known: {', '.join(sorted(BACKENDS))})", store=ctx.store_dir)
    return cls(ctx, RemoteStore(ctx.store_dir))


class _Store:
    def __init__(self, backend: StateBackend) -> None:
        self.backend = backend
        self.lock = threading.Lock()


class StoreService:
    """Implements org.pystatestore.PythonStateService for the JVM."""

    class Java:
        implements = ["org.pystatestore.PythonStateService"]

    def __init__(self) -> None:
        self._stores: dict[str, _Store] = {}
        self._lock = threading.Lock()

    # -- protocol ----------------------------------------------------------------------------
    def hello(self) -> str:
        return _reply(lambda: {"protocol": PROTOCOL_VERSION, "pid": os.getpid(), "backends": sorted(BACKENDS)})

    def openStore(self, store_json: str) -> str:  # noqa: N802 (Java interface name)
        def run() -> dict[str, Any]:
            desc = json.loads(store_json)
            ctx = context_from_description(desc)
            # One backend per provider instance (see the JVM side): no cache outlives its query run.
            handle = f"{ctx.store_dir}#{desc.get('instanceId', '')}"
            with self._lock:
                existing = self._stores.get(handle)
                if existing is None or existing.backend.ctx != ctx:
                    self._stores[handle] = _Store(make_backend(ctx))
            return {"handle": handle}

        return _reply(run)

    def load(self, handle: str, version: int, out_path: str) -> str:
        def run() -> dict[str, Any]:
            started = time.perf_counter()
            store = self._store(handle)
            with store.lock:
                result = store.backend.load(int(version))
            frames.write_buffer(out_path, result.frame)
            return {
                "numKeys": result.num_keys,
                "bytes": result.bytes_read,
                "source": result.source,
                "loadMs": _ms(started),
                **result.metrics,
            }

        return _reply(run)

    def commit(self, handle: str, base_version: int, changes_path: str, attempt_id: str) -> str:
        def run() -> dict[str, Any]:
            started = time.perf_counter()
            store = self._store(handle)
            changes = frames.read_changes(changes_path)
            with store.lock:
                result = store.backend.commit(int(base_version), changes, str(attempt_id))
            return {
                "version": result.version,
                "numKeys": result.num_keys,
                "bytesWritten": result.bytes_written,
                "filesWritten": result.files_written,
                "manifest": result.manifest,
                "commitMs": _ms(started),
                **result.metrics,
            }

        return _reply(run)

    def maintenance(self, handle: str) -> str:
        def run() -> dict[str, Any]:
            store = self._store(handle)
            with store.lock:
                return store.backend.maintenance(time.time())

        return _reply(run)

    def closeStore(self, handle: str) -> str:  # noqa: N802
        def run() -> dict[str, Any]:
            with self._lock:
                store = self._stores.pop(handle, None)
            if store is not None:
                with store.lock:
                    store.backend.close()
            return {"closed": store is not None}

        return _reply(run)

    # -- helpers -----------------------------------------------------------------------------
    def _store(self, handle: str) -> _Store:
        with self._lock:
            store = self._stores.get(handle)
        if store is None:
            raise StoreConfigError("store is not open in this worker (the JVM must call openStore first)", store=handle)
        return store


def _ms(started: float) -> int:
    return int((time.perf_counter() - started) * 1000)


def _reply(fn: Callable[[], dict[str, Any]]) -> str:
    try:
        return json.dumps(fn())
    except StateStoreError as e:
        log.warning("%s", e)
        return json.dumps({"error": {"type": type(e).__name__, "message": str(e)}})
    except Exception as e:  # noqa: BLE001 - every failure must reach the JVM as a reply
        log.error("unexpected failure\n%s", traceback.format_exc())
        return json.dumps(
            {
                "error": {
                    "type": type(e).__name__,
                    "message": f"pystatestore worker error: {type(e).__name__}: {e} (see the worker log)",
                }
            }
        )
