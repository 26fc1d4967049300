"""StateClient: a running query's state, queried while it runs (the seeds' QueryableStateClient,
made consistent; DESIGN §9). It reads the checkpoint, never the executors: it follows Spark's commit
log, brings each store it was asked about forward to every newly committed batch (replaying only
what the batch changed), and answers point lookups, multi-key lookups and partial-key scans
(questions.py), each from one committed batch that the answer names. `batch=N` reads any retained
batch. A scan answers a page of rows at a time (scan_limit_default, at most scan_limit_max) in a
fixed order, with a cursor that continues at the batch of the first page (paging.py); a multi-key
lookup asks at most lookup_keys_max keys (limits.py).

It never writes to the checkpoint and takes no lease: the query's GC is never held back. A file
GC'd under a restore is retried on a newer batch; a store that cannot be opened (a damaged or missing
file) fails the answers about it, naming the file, while every other store keeps answering.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ..reading.checkpoint import (
    DEFAULT_STORE_NAME,
    StoreLocation,
    batches_in,
    checkpoint_uri,
    commit_log_attempts,
    open_checkpoint,
    planned_conf,
    query_id_of,
)
from ..store.errors import CheckpointMissingError, StateStoreError
from ..store.remote import filesystem_for
from .answers import Answer, BatchGoneError, Lookup, QuestionError, Scan
from .layers import LayerBudget
from .layout import Layout, partitions_of_conf, shared_cache_options
from .limits import MAX_LOOKUP_KEYS, LimitError, check_lookup_keys
from .paging import DEFAULT_SCAN_LIMIT, MAX_SCAN_LIMIT, PageError, continued, page_limit, question_digest
from .questions import Questions, schema_info
from .restorer import ProcessFollower, RestoreProcess
from .served import ServedBatch, StoreId
from .versions import Follower, OpenVersion, StoreFollower

log = logging.getLogger("pystatestore.query")

DEFAULT_POLL_SECONDS = 0.25
DEFAULT_HISTORY_BATCHES = 2  # older batches kept open for time travel
DEFAULT_CACHE_MIB = 256
MISSING_FILE_RETRIES = 2  # advances to a newer batch when GC took a file under a restore


class _RetryError(Exception):
    """The batch an answer started on was replaced while it opened a store: answer on the new one."""


class StateClient:
    """A checkpoint's state, queried while the query runs (or after it stopped)."""

    def __init__(
        self,
        checkpoint: str,
        *,
        follow: bool = True,
        poll_seconds: float = DEFAULT_POLL_SECONDS,
        scratch: str | None = None,
        history_batches: int = DEFAULT_HISTORY_BATCHES,
        cache_mib: int = DEFAULT_CACHE_MIB,
        restore_in: str = "thread",
        scan_limit_default: int = DEFAULT_SCAN_LIMIT,
        scan_limit_max: int = MAX_SCAN_LIMIT,
        lookup_keys_max: int = MAX_LOOKUP_KEYS,
    ) -> None:
        """`checkpoint`: the query's checkpointLocation (a path, file:, s3://...). `follow`: a thread
        checks the commit log every `poll_seconds` and serves each newly committed batch (else call
        `refresh()`). `scratch`: where restored versions go (default: a temporary directory).
        `history_batches`: older batches kept open for `batch=N` questions. `cache_mib`: the block
        cache every opened version shares. `restore_in`: "thread" restores newly committed versions
        in this process; "process" in a child process of its own, so they never hold this
        process's GIL (what `pystatestore serve` does: answers on an event loop would wait behind
        them). `scan_limit_default`: the rows of a scan's page when it names no limit;
        `scan_limit_max`: the most it may ask for (a bigger scan pages on with the cursor).
        `lookup_keys_max`: the most keys one `get_many` may ask (more are split over several)."""
        if restore_in not in ("thread", "process"):
            raise ValueError(f'restore_in is "thread" or "process", not {restore_in!r}')
        if not 1 <= scan_limit_default <= scan_limit_max:
            raise ValueError(
                f"scan limits: 1 <= default <= maximum, not default {scan_limit_default}, maximum {scan_limit_max}"
            )
        if lookup_keys_max < 1:
            raise ValueError(f"lookup_keys_max is at least 1, not {lookup_keys_max}")
        self.scan_limit_default, self.scan_limit_max = scan_limit_default, scan_limit_max
        self.lookup_keys_max = lookup_keys_max
        self.uri = checkpoint_uri(checkpoint)
        self._fs, self._root = filesystem_for(self.uri)
        self._scratch = scratch
        self._options = shared_cache_options(cache_mib)
        self._layer_budget = LayerBudget()  # versions served from their changes, across every store (0046)
        self._history_limit = history_batches
        self._restores = RestoreProcess(scratch) if restore_in == "process" else None
        self._lock = threading.RLock()
        self._generation = 0
        self._layout = self._read_layout()
        self._questions = Questions(self.uri, lambda: self._layout, self._view)
        batch = self._layout.ckpt.last_committed_batch
        if batch is None:
            raise BatchGoneError(
                "the query has not committed a batch yet: there is no state to read",
                store=self.uri,
                file="commits/",
                advice="Start the service once the query has committed its first batch.",
            )
        self._served = self._new_served(batch)
        self._history: OrderedDict[int, tuple[ServedBatch, dict[StoreId, Follower]]] = OrderedDict()
        self.newest_committed = batch
        self.last_poll = time.time()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if follow:
            self._thread = threading.Thread(target=self._follow, args=(poll_seconds,), name="pystatestore-follow")
            self._thread.daemon = True
            self._thread.start()

    # -- what there is ---------------------------------------------------------------------
    @property
    def batch(self) -> int:
        """The committed batch answers come from (unless they ask for another)."""
        return self._served.batch

    def operators(self) -> list[dict[str, Any]]:
        """Each operator's stores: partitions, key and value schemas (Spark's JSON), key columns, and
        for transformWithState stores their state variables (column families) with theirs."""
        layout = self._layout
        out: dict[int, dict[str, Any]] = {}
        for op in layout.ckpt.operators():
            names = sorted({s.store_name for s in layout.ckpt.stores_of(op)})
            stores = []
            for name in names:
                partitions = sorted(s.partition_id for s in layout.ckpt.stores_of(op) if s.store_name == name)
                info: dict[str, Any] = {"name": name, "partitions": len(partitions)}
                try:
                    with self._served_for(None) as served:
                        opened = self._view(served, (op, partitions[0], name))
                        info.update(schema_info(opened.key_schema, opened.value_schema, opened.key_encoding))
                        if opened.has_families:
                            info["families"] = [
                                {"name": f.name, "multipleValues": f.multiple_values, "keyEncoding": f.key_encoding}
                                | schema_info(f.key_schema, f.value_schema, f.key_encoding)
                                for f in sorted(opened.families().values(), key=lambda f: f.family_id)
                            ]
                except StateStoreError as e:
                    info["error"] = str(e)
                stores.append(info)
            out[op] = {"operator": op, "stores": stores}
        return [out[op] for op in sorted(out)]

    def open_all(self) -> None:
        """Opens every store at the batch served now, so no question waits for a first restore (the
        service does this in the background as it starts); a store that fails is recorded, as a
        question about it would be."""
        with self._lock:
            served = self._served
            for loc in self._layout.ckpt.stores:
                if loc.foreign is None and served is self._served:
                    try:
                        self._view(served, (loc.operator_id, loc.partition_id, loc.store_name))
                    except StateStoreError:
                        pass  # recorded in the batch served: questions about the store get it

    # -- questions -------------------------------------------------------------------------
    def get(
        self,
        key: dict[str, Any],
        *,
        operator: int = 0,
        store: str = DEFAULT_STORE_NAME,
        family: str | None = None,
        batch: int | None = None,
    ) -> Answer:
        """The value of `key` (a JSON object of every key column, as `pystatestore read -o -` prints
        keys) at `batch` (default: the newest committed one served)."""
        return self.get_many([key], operator=operator, store=store, family=family, batch=batch).results[0]

    def get_many(
        self,
        keys: list[dict[str, Any]],
        *,
        operator: int = 0,
        store: str = DEFAULT_STORE_NAME,
        family: str | None = None,
        batch: int | None = None,
    ) -> Lookup:
        """The values of `keys` (at most `lookup_keys_max`), every one read at the same batch."""
        self._check_where(operator, batch)
        try:
            check_lookup_keys(len(keys), self.lookup_keys_max)
        except LimitError as e:
            raise QuestionError(str(e), store=self.uri) from None
        for k in keys:
            if not isinstance(k, dict):
                raise QuestionError(f"a key is a JSON object of key fields, not {k!r}", store=self.uri)
        return self._answer(batch, lambda served: self._questions.lookup(served, keys, operator, store, family))

    def scan(
        self,
        key: dict[str, Any] | None = None,
        *,
        limit: int | None = None,
        cursor: str | None = None,
        operator: int = 0,
        store: str = DEFAULT_STORE_NAME,
        family: str | None = None,
        batch: int | None = None,
    ) -> Scan:
        """A page of up to `limit` rows (key, value, partition; default `scan_limit_default`, at most
        `scan_limit_max`) whose key has the fields of `key` (some of the key columns; none: every
        row), read across every partition at one batch: partition by partition, and within one in
        stored key order. When more remain the answer's `cursor` continues after its last row at the
        same batch: ask again with it (and the same key, operator, store and family) for the next
        page; every matching row comes exactly once. BatchGoneError once retention took that batch."""
        if key is not None and not isinstance(key, dict):
            raise QuestionError(f"a partial key is a JSON object of some key fields, not {key!r}", store=self.uri)
        self._check_where(operator, batch)
        question = question_digest(key or {}, operator, store, family)
        start = None
        try:
            limit = page_limit(limit, self.scan_limit_default, self.scan_limit_max)
            if cursor is not None:
                start, batch = continued(cursor, question, batch)
        except PageError as e:
            raise QuestionError(str(e), store=self.uri) from None
        return self._answer(
            batch,
            lambda served: self._questions.scan(
                served, key or {}, limit, operator, store, family, start=start, question=question
            ),
        )

    def _check_where(self, operator: Any, batch: Any) -> None:
        """operator and batch are whole numbers (a negative batch is never in the commit log)."""
        for name, value in (("operator", operator), ("batch", batch)):
            if value is None and name == "batch":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise QuestionError(f"{name} is a whole number, 0 or more, not {value!r}", store=self.uri)

    def status(self) -> dict[str, Any]:
        """The batch served, the newest in the commit log at the last check, the stores open and
        those that failed (with why); `ready` once every store of the checkpoint is open at the batch
        served, so no question waits for a first restore."""
        served = self._served
        opened = len(served.opened())
        total = sum(1 for s in self._layout.ckpt.stores if s.foreign is None)
        return {
            "checkpoint": self.uri,
            "batch": served.batch,
            "newestCommitted": self.newest_committed,
            "lagBatches": max(0, self.newest_committed - served.batch),
            "lastPoll": self.last_poll,
            "ready": opened == total,
            "storesOpen": opened,
            "storesTotal": total,
            "storesFailed": {f"{op}/{p}/{name}": str(e) for (op, p, name), e in served.failures().items()},
        }

    # -- following the commit log ----------------------------------------------------------
    def refresh(self) -> int:
        """Checks the commit log now and serves its newest batch; returns the batch served."""
        with self._lock:  # listed under the lock, so a slower poll never goes back to an older batch
            committed = batches_in(self._fs, self._root, "commits")
            self.last_poll = time.time()
            if committed:
                self.newest_committed = committed[-1]
                if committed[-1] != self._served.batch:
                    self._advance(committed[-1])
            return self._served.batch

    def _follow(self, poll_seconds: float) -> None:
        while not self._stop.wait(poll_seconds):
            try:
                self.refresh()
            except Exception:  # noqa: BLE001 - the follower must outlive a bad poll; answers name the cause
                log.exception("checkpoint %s: following the commit log failed; trying again", self.uri)

    def _advance(self, batch: int) -> None:
        """Serves `batch`: every store open at the batch served now is brought to it first, so the
        swap is one step and no answer mixes batches. A file the query's GC deleted under a restore
        (the follower fell behind by more than the retained versions) is read again at the newest
        batch; a store that still cannot be opened fails the answers about it, naming why."""
        with self._lock:
            old = self._served
            for _ in range(MISSING_FILE_RETRIES + 1):
                n = partitions_of_conf(planned_conf(self._fs, self._root, batch))
                if batch < old.batch or (n is not None and n != self._layout.num_partitions) or self._replaced():
                    # The checkpoint was replaced or rescaled (a rewrite moved into place): read afresh.
                    self._reload_layout()
                new = self._new_served(batch)
                attempts = commit_log_attempts(self._fs, self._root, [batch])
                for store in old.stores():
                    if self._layout.location(store) is not None:
                        new.add(store, self._open_followed(store, new.version, attempts))
                newer = batches_in(self._fs, self._root, "commits")
                missing = any(isinstance(e, CheckpointMissingError) for e in new.failures().values())
                if not (missing and newer and newer[-1] > batch):
                    break
                new.retire()
                batch = self.newest_committed = newer[-1]
            self._served = new
            old.retire()

    def _replaced(self) -> bool:
        """Whether the checkpoint's query id changed (another checkpoint moved into this location)."""
        known = self._layout.ckpt.query_id
        return known is not None and query_id_of(self._fs, self._root) not in (None, known)

    def _read_layout(self) -> Layout:
        ckpt = open_checkpoint(self.uri)
        self._generation += 1
        return Layout(ckpt, self._generation, partitions_of_conf(ckpt.conf))

    def _reload_layout(self) -> None:
        old = self._layout
        self._layout = self._read_layout()
        self._served.after_close(old.close)

    def _new_served(self, batch: int) -> ServedBatch:
        return ServedBatch(batch, self._layout.generation)

    def _open_followed(
        self, store: StoreId, version: int, attempts: dict[tuple[int, int, str], list[tuple[int, str]]] | None = None
    ) -> OpenVersion | StateStoreError:
        """`store` at `version` through its follower (made on first use)."""
        layout = self._layout
        location = layout.location(store)
        if location is None:
            return QuestionError(f"the checkpoint has no store {_store_text(store)}", store=self.uri)
        try:
            follower = layout.followers.get(store)
            if follower is None:
                follower = layout.followers[store] = self._new_follower(location)
            cid = dict((attempts or {}).get(store, ())).get(version)
            if cid is None and location.attempts:
                cid = self._attempt_of(store, version)
            return follower.open(version, cid)
        except StateStoreError as e:
            return e
        except OSError as e:  # the checkpoint's storage failed under the restore
            return StateStoreError(f"reading the store failed: {e}", store=location.uri, version=version)

    def _new_follower(self, location: StoreLocation) -> Follower:
        if self._restores is not None:
            return ProcessFollower(location, self._restores, self._scratch, self._options, self._layer_budget)
        return StoreFollower(location, self._scratch, self._options, self._layer_budget)

    def _attempt_of(self, store: StoreId, version: int) -> str | None:
        """Checkpoint format v2: the attempt of `version` the commit log names."""
        found = commit_log_attempts(self._fs, self._root, [version - 1]).get(store, [])
        return dict(found).get(version)

    # -- answering -------------------------------------------------------------------------
    def _answer(self, batch: int | None, fn: Callable[[ServedBatch], Any]) -> Any:
        for _ in range(8):
            try:
                with self._served_for(batch) as served:
                    return fn(served)
            except _RetryError:
                continue
        raise StateStoreError(
            "the query committed batches faster than this answer could open their stores",
            store=self.uri,
            advice="Ask again.",
        )

    def _served_for(self, batch: int | None) -> Any:
        """The ServedBatch of `batch` (default: the one followed), pinned while the answer reads."""
        return _Pinned(self, batch)

    def _pin(self, batch: int | None) -> ServedBatch:
        if batch is not None and batch > self._served.batch:
            self.refresh()  # a batch committed since the last poll
        if batch is None or batch == self._served.batch:
            served = self._served
        else:
            served = self._historic(batch)
        if not served.pin():
            raise _RetryError()
        return served

    def _historic(self, batch: int) -> ServedBatch:
        """An older (or not yet followed) batch, opened by followers of its own."""
        with self._lock:
            found = self._history.get(batch)
            if found is not None:
                self._history.move_to_end(batch)
                return found[0]
            committed = batches_in(self._fs, self._root, "commits")
            if batch not in committed:
                span = f"{committed[0]}..{committed[-1]}" if committed else "none"
                raise BatchGoneError(
                    f"batch {batch} is not in the commit log (committed: {span})",
                    store=self.uri,
                    file=f"commits/{batch}",
                )
            served = ServedBatch(batch, self._layout.generation)
            followers: dict[StoreId, Follower] = {}
            served.after_close(lambda: [f.close() for f in followers.values()])
            self._history[batch] = (served, followers)
            while len(self._history) > self._history_limit:
                _, (evicted, _) = self._history.popitem(last=False)
                evicted.retire()
            return served

    def _view(self, served: ServedBatch, store: StoreId) -> OpenVersion:
        """`store`'s open version at `served`'s batch, opened on first use."""
        opened = served.get(store)
        if opened is None:
            with self._lock:
                opened = served.get(store)
                if opened is None:
                    opened = self._open_into(served, store)
        if isinstance(opened, StateStoreError):
            raise opened
        return opened

    def _open_into(self, served: ServedBatch, store: StoreId) -> OpenVersion | StateStoreError:
        if served.layout_generation != self._layout.generation:
            raise _RetryError()
        history = self._history.get(served.batch)
        if history is not None and history[0] is served:
            opened = self._open_historic(history[1], store, served.version)
        elif served is self._served:
            opened = self._open_followed(store, served.version)
        else:
            raise _RetryError()  # replaced by a newer batch while this answer started
        served.add(store, opened)
        return opened

    def _open_historic(
        self, followers: dict[StoreId, Follower], store: StoreId, version: int
    ) -> OpenVersion | StateStoreError:
        location = self._layout.location(store)
        if location is None:
            return QuestionError(f"the checkpoint has no store {_store_text(store)}", store=self.uri)
        try:
            follower = followers.get(store)
            if follower is None:
                follower = followers[store] = self._new_follower(location)
            return follower.open(version, self._attempt_of(store, version) if location.attempts else None)
        except CheckpointMissingError as e:
            return BatchGoneError(
                f"batch {version - 1} is no longer retained: {e.problem}", store=e.store, version=version, file=e.file
            )
        except StateStoreError as e:
            return e

    # -- closing ---------------------------------------------------------------------------
    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            for served, _ in self._history.values():
                served.retire()
            self._history.clear()
            self._served.after_close(self._layout.close)
            if self._restores is not None:
                self._served.after_close(self._restores.close)
            self._served.retire()

    def __enter__(self) -> StateClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Pinned:
    """`with client._served_for(batch) as served:` the batch pinned while an answer reads it."""

    def __init__(self, client: StateClient, batch: int | None) -> None:
        self.client, self.batch = client, batch
        self.served: ServedBatch | None = None

    def __enter__(self) -> ServedBatch:
        self.served = self.client._pin(self.batch)
        return self.served

    def __exit__(self, *exc: Any) -> None:
        assert self.served is not None
        self.served.unpin()


def _store_text(store: StoreId) -> str:
    op, p, name = store
    return f"'{name}' of operator {op} partition {p}"


__all__ = ["Answer", "BatchGoneError", "Lookup", "QuestionError", "Scan", "StateClient"]
