"""A fixed pool of threads that runs urgent jobs before the others: the copier's threads, on which
a load's copy into L1 (LMCache is waiting for it) never queues behind the copies of stores.

Jobs of one kind run in the order they came, and at most ``bulk_threads`` threads run jobs that
are not urgent at once: a store's copy only has to keep ahead of the disk, and every byte copied
at once inside LMCache's process slows LMCache's own threads (bench/results/lookup-copy/). An
urgent job may take any thread. ``close`` lets every queued job run, then joins.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

from lmcache_adp.logs import log

Job = Callable[[], None]


class Workers:
    def __init__(self, threads: int, name: str, bulk_threads: int | None = None) -> None:
        self._urgent: deque[Job] = deque()
        self._bulk: deque[Job] = deque()
        self._bulk_threads = threads if bulk_threads is None else max(1, bulk_threads)
        self._bulk_running = 0
        self._ready = threading.Condition()
        self._closing = False
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True)
            for i in range(threads)
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
        while (taken := self._take()) is not None:
            job, bulk = taken
            try:
                job()
            except Exception:  # a job reports its own failures; this only keeps the thread
                log.exception("a job on the plugin's worker threads raised")
            if bulk:  # this thread goes back to _take: it runs the next bulk job if one waits
                with self._ready:
                    self._bulk_running -= 1

    def _take(self) -> tuple[Job, bool] | None:
        """The next job and whether it is bulk; None once closing with nothing left."""
        with self._ready:
            while True:
                if self._urgent:
                    return self._urgent.popleft(), False
                if self._bulk and self._bulk_running < self._bulk_threads:
                    self._bulk_running += 1
                    job = self._bulk.popleft()
                    if self._closing and not self._bulk:
                        self._ready.notify_all()  # threads kept waiting for a bulk turn may end
                    return job, True
                if self._closing and not self._bulk:
                    return None
                self._ready.wait()
