"""The I/O threads: ``size`` of them take the scheduler's tasks, and one held by its task for
``HELD_S`` is replaced, so that peers that never answer cost their own ops, never everyone's.

A store that reads its client's memory waits in the kernel until the client's pages answer,
and a task on a stalled drive until the drive does; neither wait can be interrupted. The
scheduler keeps each session and each database to its share of the threads (scheduler.py), but
a few such clients, or such a client and a stalled drive, would still hold them all, and every
other session's loads would expire. So while fewer than ``size`` threads are free (idle, or
running a task younger than ``HELD_S``), the housekeeping thread starts another:

- beside every held task that reads a client's memory, whatever it waits on: the scheduler
  holds each session to its share of them;
- beside tasks held by the drives, up to ``drives_held_max`` of them (the databases' shares):
  ``HELD_S`` cannot tell a stalled drive from a slow one, whose queue more threads keep going;
- never past ``threads_max`` alive: a client that reconnects while its reads are stuck gets a
  new session and a new share, so the shares alone bound nothing.

A thread whose task returns while more than ``size`` are free ends.

Thread-safe: the I/O threads, the housekeeping thread and ``status`` call it.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import dataclass

from adp_gateway.scheduling.scheduler import Scheduler, Task
from adp_wire.protocol import Status
from adp_wire.threads import NamedThread

log = logging.getLogger(__name__)
HELD_S = 1.0  # a task running this long holds its thread: another may start beside it
WAIT_S = 0.5  # how long an idle thread waits for a task before it looks at ``stopping`` again


@dataclass(frozen=True)
class IoThreadsState:
    size: int  # the config's io_threads
    alive: int
    held: int  # running a task for HELD_S or more


@dataclass(frozen=True)
class _Running:
    since: float  # when the task began
    reads_client: bool  # it reads its client's memory (held, it may wait on that or a drive)


class IoThreads:
    def __init__(
        self,
        size: int,
        scheduler: Scheduler,
        stopping: threading.Event,
        *,
        drives_held_max: int,
        threads_max: int,
    ) -> None:
        self.size = size
        self._drives_held_max = drives_held_max
        self._threads_max = threads_max
        self._scheduler = scheduler
        self._stopping = stopping
        self._lock = threading.Lock()
        self._threads: dict[int, threading.Thread] = {}  # number -> thread, while alive
        self._running: dict[int, _Running] = {}  # number -> its task, while it runs one
        self._numbers = itertools.count()

    def start(self) -> None:
        with self._lock:
            for _ in range(self.size):
                self._add()

    def settle(self) -> None:
        """Start threads while fewer than ``size`` are free: as many as there are held ones to
        replace (the module's doc says which), never past ``threads_max``; none once stopping."""
        with self._lock:
            if self._stopping.is_set():
                return
            now = time.monotonic()
            by_clients, by_drives = self._held_counts(now)
            replacing = by_clients + min(by_drives, self._drives_held_max)
            wanted = min(self._threads_max, self.size + replacing)
            free = len(self._threads) - by_clients - by_drives
            for _ in range(min(self.size - free, wanted - len(self._threads))):
                if not self._add():
                    return

    def threads(self) -> list[threading.Thread]:
        """The threads alive now (after ``stopping`` is set, no more start)."""
        with self._lock:
            return list(self._threads.values())

    def state(self) -> IoThreadsState:
        with self._lock:
            return IoThreadsState(
                self.size, len(self._threads), sum(self._held_counts(time.monotonic()))
            )

    def _add(self) -> bool:
        """Under the lock: start one more thread; False if the system would not."""
        number = next(self._numbers)
        thread = NamedThread(target=self._serve, args=(number,), name=f"io-{number}", daemon=True)
        try:
            thread.start()  # it waits for the lock before it can end
        except RuntimeError:
            log.exception("could not start an I/O thread (%d running)", len(self._threads))
            return False
        self._threads[number] = thread
        return True

    def _held_counts(self, now: float) -> tuple[int, int]:
        """Under the lock: the tasks running for HELD_S or more that read a client's memory,
        and those that do not."""
        by_clients = by_drives = 0
        for task in self._running.values():
            if now - task.since >= HELD_S:
                if task.reads_client:
                    by_clients += 1
                else:
                    by_drives += 1
        return by_clients, by_drives

    def _free(self, now: float) -> int:
        """Under the lock: the threads alive and not held (idle, or running a young task)."""
        return len(self._threads) - sum(self._held_counts(now))

    def _serve(self, number: int) -> None:
        try:
            while not self._stopping.is_set():
                task = self._scheduler.next(timeout_s=WAIT_S)
                if task is None:
                    continue
                with self._lock:
                    self._running[number] = _Running(time.monotonic(), task.reads_client)
                run_task(self._scheduler, task)
                with self._lock:
                    del self._running[number]
                    if self._free(time.monotonic()) > self.size:  # a held one was replaced
                        del self._threads[number]  # at once: another deciding counts it gone
                        return
        finally:
            with self._lock:
                self._threads.pop(number, None)
                self._running.pop(number, None)  # a task that raised past run_task


def run_task(scheduler: Scheduler, task: Task) -> None:
    """Run one queued task on an I/O thread. A bug must not kill the thread: the task's ops
    fail (those it completed already stay as they were: a session reports each op once)."""
    try:
        task.run()
    except Exception:
        log.exception("unexpected error in an I/O task")
        task.cancel(Status.FAILED)
    finally:
        scheduler.finished(task)
