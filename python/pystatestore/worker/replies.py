"""The JSON replies the JVM gets: every call's, a failure included (so the JVM can tell "the worker
said no" from "the worker died"), and what a version made readable reports."""

from __future__ import annotations

import json
import logging
import traceback
from collections.abc import Callable
from typing import Any

from ..store.backends import LoadResult
from ..store.backends.context import StoreContext, elapsed_ms
from ..store.errors import StateStoreError
from .disk_errors import disk_failure, explain
from .memory_use import worker_rss_bytes

log = logging.getLogger("pystatestore.service")


def reply(
    fn: Callable[[], dict[str, Any]],
    *,
    store: Callable[[], StoreContext | None] | None = None,
    doing: str = "",
) -> str:
    """`fn`'s result as JSON, or the failure it raised as {"error": {"type", "message"}}. A full
    disk or an unwritable place is said so, with what to do, for the store `store` gives (if open)
    and the call `doing` describes."""
    try:
        return json.dumps(fn())
    except StateStoreError as e:
        log.warning("%s", e)
        return _error(e, str(e), store)
    except Exception as e:  # noqa: BLE001 - every failure must reach the JVM as a reply
        log.error("unexpected failure\n%s", traceback.format_exc())
        ctx = _context(store)
        during = f"{doing or 'a call'} of store {ctx.store_dir if ctx else '(not open)'}"
        return _error(
            e, f"pystatestore worker error during {during}: {type(e).__name__}: {e} (see the worker log)", store
        )


def _context(store: Callable[[], StoreContext | None] | None) -> StoreContext | None:
    try:
        return store() if store is not None else None
    except Exception:  # noqa: BLE001 - naming the store must never hide the failure itself
        return None


def _error(e: BaseException, message: str, store: Callable[[], StoreContext | None] | None) -> str:
    failure = disk_failure(e)
    if failure is not None:
        message = f"{message.rstrip('.')}. The cause: {explain(failure, _context(store))}."
    return json.dumps({"error": {"type": type(e).__name__, "message": message}})


def load_reply(result: LoadResult, started: float) -> dict[str, Any]:
    """What the JVM hears of a version made readable (load, replay)."""
    return {
        "workerRssBytes": worker_rss_bytes(),
        "manifestId": result.manifest_id,
        "numKeys": result.num_keys,
        "numInternalKeys": result.num_internal_keys,
        "bytes": result.bytes_read,
        "source": result.source,
        "loadMs": elapsed_ms(started),
        **result.metrics,
    }


def log_restore(handle: str, version: int, result: LoadResult) -> None:
    """One executor-log line per version rebuilt (not one already in memory): where its files came
    from is what tells a user whether local recovery works for them."""
    if result.source == "memory":
        return
    m = result.metrics
    if "restoreMs" not in m:  # a backend without per-source figures
        log.info(
            "store %s: restored version %d from %s (%d bytes read)", handle, version, result.source, result.bytes_read
        )
        return
    log.info(
        "store %s: restored version %d from %s in %d ms: %d files (%d bytes) from the local copy, "
        "%d files (%d bytes) and %d bytes inside manifests from the checkpoint, changes of %d versions replayed",
        handle,
        version,
        result.source,
        m["restoreMs"],
        m.get("restoreLocalFiles", 0),
        m.get("restoreLocalBytes", 0),
        m.get("restoreRemoteFiles", 0),
        m.get("restoreRemoteBytes", 0),
        m.get("restoreInlineBytes", 0),
        m.get("restoreChangelogVersions", 0),
    )
