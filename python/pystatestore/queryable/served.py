"""One committed batch as the service serves it: the open version of each store asked about so far
(or why it could not be opened), pinned by the answers reading it. Every answer reads all its keys
from one ServedBatch, so it is whole and from one batch; a newer batch replaces it, and its versions
close when the last answer reading them is done."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..store.errors import StateStoreError
from .versions import OpenVersion

StoreId = tuple[int, int, str]  # (operator, partition, store name)


class ServedBatch:
    def __init__(self, batch: int, layout_generation: int) -> None:
        self.batch = batch
        self.version = batch + 1  # Spark's state of batch b is version b + 1
        self.layout_generation = layout_generation
        self._stores: dict[StoreId, OpenVersion | StateStoreError] = {}
        self._lock = threading.Lock()
        self._pins = 0
        self._retired = False
        self._after_close: list[Callable[[], None]] = []

    def after_close(self, fn: Callable[[], None]) -> None:
        """Runs `fn` once this batch's versions are closed (the followers that made them go then)."""
        self._after_close.append(fn)

    def add(self, store: StoreId, opened: OpenVersion | StateStoreError) -> None:
        """A store opened at this batch (by whoever holds the client's lock), or why it was not."""
        with self._lock:
            old = self._stores.get(store)
            self._stores[store] = opened
        if isinstance(old, OpenVersion):
            old.release()

    def get(self, store: StoreId) -> OpenVersion | StateStoreError | None:
        return self._stores.get(store)

    def stores(self) -> list[StoreId]:
        with self._lock:
            return list(self._stores)

    def opened(self) -> dict[StoreId, OpenVersion]:
        with self._lock:
            return {s: v for s, v in self._stores.items() if isinstance(v, OpenVersion)}

    def failures(self) -> dict[StoreId, StateStoreError]:
        with self._lock:
            return {s: v for s, v in self._stores.items() if isinstance(v, StateStoreError)}

    def pin(self) -> bool:
        """Holds the batch's versions open for an answer; False once it was retired and let go."""
        with self._lock:
            if self._retired and self._pins == 0:
                return False
            self._pins += 1
            return True

    def unpin(self) -> None:
        with self._lock:
            self._pins -= 1
            done = self._retired and self._pins == 0
        if done:
            self._close()

    @contextmanager
    def pinned(self) -> Iterator[bool]:
        ok = self.pin()
        try:
            yield ok
        finally:
            if ok:
                self.unpin()

    def retire(self) -> None:
        """A newer batch is served: close once no answer reads this one."""
        with self._lock:
            self._retired = True
            done = self._pins == 0
        if done:
            self._close()

    def _close(self) -> None:
        with self._lock:
            stores, self._stores = self._stores, {}
        for opened in stores.values():
            if isinstance(opened, OpenVersion):
                opened.release()
        for fn in self._after_close:
            fn()


__all__ = ["ServedBatch", "StoreId"]
