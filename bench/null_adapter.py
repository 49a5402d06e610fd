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

With ``copy: true`` (the ``null_copy`` contender) it also reads each store's buffers as our
plugin's copy path does: the plugin's own ``Copier`` copies them, in the same slices on as many
threads as the plugin takes by default (``copy_threads`` in lmcache_adp/config.py), into a
scratch ring the size of a session's window, and a store completes no sooner than its copy. That
isolates what reading L1 inside LMCache's process costs LMCache's lookups from everything else
our plugin and gateway do.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time

import numpy as np

from lmcache_adp import config
from lmcache_adp.completions import Completion, CompletionQueue
from lmcache_adp.copier import Copier

SCRATCH_BYTES = 512 * 2**20  # the gateway's default session window


class NullConnector:
    def __init__(self, store_gbps: float = 1.5, copy: bool = False, **_: object) -> None:
        self._bytes_per_s = float(store_gbps) * 1e9
        self._copier = Copier(config.copy_threads(config.parse({}))) if copy else None
        self._scratch = memoryview(np.empty(SCRATCH_BYTES if self._copier else 0, np.uint8))
        self._scratch_at = 0  # where the next copy lands in the scratch ring
        self._copying: dict[int, int] = {}  # future id -> buffers still being copied
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
            if self._copier is not None:
                self._copying[future_id] = len(memviews)
            self._wake.notify()
        if self._copier is not None:
            for memview in memviews:
                self._copy(future_id, memview.cast("B"))
        return future_id

    def _copy(self, future_id: int, source: memoryview) -> None:
        """Copy one buffer into the scratch ring (the plugin's Copier, as on its copy path)."""
        assert self._copier is not None
        size = min(source.nbytes, len(self._scratch))
        if self._scratch_at + size > len(self._scratch):
            self._scratch_at = 0
        destination = self._scratch[self._scratch_at : self._scratch_at + size]
        self._scratch_at += size

        def copied(ok: bool) -> None:
            with self._wake:
                self._copying[future_id] -= 1
                self._wake.notify()

        self._copier.copy(destination, source[:size], copied)

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
        if self._copier is not None:
            self._copier.close()
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
                if self._copying.get(future_id, 0) > 0:  # its copy is still running
                    self._wake.wait()
                    continue
                self._copying.pop(future_id, None)
                if (wait_s := due_at - time.monotonic()) > 0:
                    self._wake.wait(wait_s)
                    continue
                heapq.heappop(self._due)
                self._stored.update(keys)
                self._completions.push(future_id, True, "", [True] * len(keys))
            for _, future_id, keys in self._due:  # closing: what was still "writing" failed
                self._completions.push(future_id, False, "closed", [False] * len(keys))
