"""A floor for lookups under load: an L2 adapter that costs LMCache nothing.

``NullConnector`` is a native_plugin (the same seven methods as ``ADPConnector``) that keeps no
bytes and does no I/O: a store completes, successfully, after the time a disk of
``store_gbps`` would take to write it, without reading its buffers; EXISTS answers at once from a
set of the keys stored; loads miss. Driven through a real ``lmcache server``, it shows how much a
lookup slows down while LMCache itself writes a prompt through to L2 (its own GPU or CPU copies,
its store controller, the client's traffic), whatever the tier under it: what is left for any
adapter to remove. bench/lookup_under_load.py runs it as the ``null`` contender.

    --l2-adapter '{"type":"native_plugin","module_path":"bench.null_adapter",
                   "class_name":"NullConnector","adapter_params":{"store_gbps":1.5}}'
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time

from lmcache_adp.completions import Completion, CompletionQueue


class NullConnector:
    def __init__(self, store_gbps: float = 1.5, **_: object) -> None:
        self._bytes_per_s = float(store_gbps) * 1e9
        self._completions = CompletionQueue()
        self._future_ids = itertools.count(1)
        self._stored: set[str] = set()
        self._due: list[tuple[float, int, list[str]]] = []  # heap of stores still "writing"
        self._disk_free_at = 0.0  # the simulated disk writes one store after another
        self._wake = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._complete_stores, name="null-l2", daemon=True)
        self._thread.start()

    def event_fd(self) -> int:
        return self._completions.fd

    def submit_batch_set(self, keys: list[str], memviews: list[memoryview]) -> int:
        future_id = next(self._future_ids)
        nbytes = sum(m.nbytes for m in memviews)
        with self._wake:
            start = max(time.monotonic(), self._disk_free_at)
            self._disk_free_at = start + nbytes / self._bytes_per_s
            heapq.heappush(self._due, (self._disk_free_at, future_id, list(map(str, keys))))
            self._wake.notify()
        return future_id

    def submit_batch_get(self, keys: list[str], memviews: list[memoryview]) -> int:
        return self._answer([False] * len(keys))

    def submit_batch_exists(self, keys: list[str]) -> int:
        with self._wake:
            found = [str(key) in self._stored for key in keys]
        return self._answer(found)

    def submit_batch_delete(self, keys: list[str]) -> int:
        with self._wake:
            found = [str(key) in self._stored for key in keys]
            self._stored.difference_update(map(str, keys))
        return self._answer(found)

    def drain_completions(self) -> list[Completion]:
        return self._completions.drain()

    def close(self) -> None:
        with self._wake:
            self._closing = True
            self._wake.notify()
        self._thread.join()
        self._completions.close()

    def _answer(self, per_key: list[bool]) -> int:
        future_id = next(self._future_ids)
        self._completions.push(future_id, True, "", per_key)
        return future_id

    def _complete_stores(self) -> None:
        with self._wake:
            while not self._closing:
                if not self._due:
                    self._wake.wait()
                    continue
                due_at, future_id, keys = self._due[0]
                if (wait_s := due_at - time.monotonic()) > 0:
                    self._wake.wait(wait_s)
                    continue
                heapq.heappop(self._due)
                self._stored.update(keys)
                self._completions.push(future_id, True, "", [True] * len(keys))
            for _, future_id, keys in self._due:  # closing: what was still "writing" failed
                self._completions.push(future_id, False, "closed", [False] * len(keys))
