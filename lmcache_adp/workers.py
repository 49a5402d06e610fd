"""A fixed pool of threads that runs urgent jobs before the others: the copier's threads, on which
a load's copy into L1 (LMCache is waiting for it) never queues behind the copies of stores.

Jobs of one kind run in the order they came. ``close`` lets every queued job run, then joins.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

from adp_wire.threads import NamedThread
from lmcache_adp.logs import log

Job = Callable[[], None]


class Workers:
    def __init__(self, threads: int, name: str) -> None:
        self._urgent: deque[Job] = deque()
        self._bulk: deque[Job] = deque()
        self._ready = threading.Condition()
        self._closing = False
        self._threads = [
            NamedThread(target=self._run, name=f"{name}-{i}", daemon=True) for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, job: Job, urgent: bool = False) -> None:
        with self._ready:
            if self._closing:
                raise RuntimeError("the workers are closed")
            (self._urgent if urgent else self._bulk).append(job)
            self._ready.notify()

    def close(self) -> None:
        """Run every queued job, then stop the threads."""
        with self._ready:
            self._closing = True
            self._ready.notify_all()
        for thread in self._threads:
            thread.join()

    def _run(self) -> None:
        while (job := self._take()) is not None:
            try:
                job()
            except Exception:  # a job reports its own failures; this only keeps the thread
                log.exception("a job on the plugin's worker threads raised")

    def _take(self) -> Job | None:
        with self._ready:
            while not (self._urgent or self._bulk or self._closing):
                self._ready.wait()
            if self._urgent:
                return self._urgent.popleft()
            if self._bulk:
                return self._bulk.popleft()
            return None
