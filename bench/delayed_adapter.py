"""Our plugin with its stores held back, to tell a store's write-through apart from its submit.

On the H200 the slow lookup of a write-through is the first one after each store
(``a7353c1:bench/results/h200/adc2c30/``). That lookup meets both LMCache's own work on the
new store and the start of ours: the plugin posting the store's requests, the gateway starting to
write them, the copy path filling the window. ``DelayedStores`` is a native_plugin wrapper around
the product's own ``ADPConnector``, unchanged: it hands each store batch to it ``delay_ms`` after
LMCache submits it, and passes every other op straight through. If the first lookup after a store
is then as fast as the others (and a later one slows instead), the tail is the start of our
write-through, not LMCache's. bench/lookup_under_load.py runs it as ``lmcache_adp_delayed`` and
``lmcache_adp_shm_delayed`` (``@delay_ms=N`` changes the default of 30 ms).

Future ids are the wrapper's own, mapped to the plugin's under one lock, so a completion is never
drained before its mapping exists.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

from lmcache_adp import ADPConnector

Completion = tuple[int, bool, str, list[bool] | None]


class DelayedStores:
    """The seven native_plugin methods; stores reach ``ADPConnector`` ``delay_ms`` late."""

    def __init__(self, delay_ms: float = 30.0, **params: Any) -> None:
        self._inner = ADPConnector(**params)
        self._delay_s = delay_ms / 1000
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._due = threading.Condition(self._lock)
        self._ours: dict[int, int] = {}  # the plugin's future id -> the one LMCache holds
        self._held: list[tuple[float, int, list[str], list[memoryview]]] = []  # a heap
        self._closing = False
        self._thread = threading.Thread(target=self._release, name="delayed-stores", daemon=True)
        self._thread.start()

    def event_fd(self) -> int:
        return self._inner.event_fd()

    def submit_batch_set(self, keys: list[str], memviews: list[memoryview]) -> int:
        with self._lock:
            future = next(self._ids)
            heapq.heappush(self._held, (time.monotonic() + self._delay_s, future, keys, memviews))
            self._due.notify()
            return future

    def submit_batch_get(self, keys: list[str], memviews: list[memoryview]) -> int:
        return self._through(lambda: self._inner.submit_batch_get(keys, memviews))

    def submit_batch_exists(self, keys: list[str]) -> int:
        return self._through(lambda: self._inner.submit_batch_exists(keys))

    def submit_batch_delete(self, keys: list[str]) -> int:
        return self._through(lambda: self._inner.submit_batch_delete(keys))

    def drain_completions(self) -> list[Completion]:
        with self._lock:
            return [
                (self._ours.pop(future), ok, error, results)
                for future, ok, error, results in self._inner.drain_completions()
            ]

    def close(self) -> None:
        """Hand every held store to the plugin now, then close it (it reports them all)."""
        with self._lock:
            self._closing = True
            self._due.notify()
            while self._held:
                self._hand_over()
        self._thread.join()
        self._inner.close()

    def _through(self, submit: Callable[[], int]) -> int:
        with self._lock:
            future = next(self._ids)
            self._ours[submit()] = future
            return future

    def _release(self) -> None:
        with self._lock:
            while not self._closing:
                if not self._held:
                    self._due.wait()
                elif (wait_s := self._held[0][0] - time.monotonic()) > 0:
                    self._due.wait(wait_s)
                else:
                    self._hand_over()

    def _hand_over(self) -> None:
        """The earliest held store to the plugin; under the lock."""
        _, future, keys, memviews = heapq.heappop(self._held)
        self._ours[self._inner.submit_batch_set(keys, memviews)] = future
