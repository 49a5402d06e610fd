"""The I/O threads: ``size`` of them take the scheduler's tasks, and one held by its task for
``HELD_S`` is replaced, so that peers that never answer cost their own ops, never everyone's.

A store that reads its client's memory waits in the kernel until the client's pages answer,
and a task on a stalled drive until the drive does; neither wait can be interrupted. The
scheduler keeps each session and each database to its share of the threads (scheduler.py), but
a few such clients, or such a client and a stalled drive, would still hold them all, and every
other session's loads would expire. So while fewer than ``size`` threads are free (idle, or
running a task younger than ``HELD_S``), the housekeeping thread starts another. Every thread
held by a client's memory is replaced: the scheduler holds each session to its share, so
max_sessions of them bound the pool. Threads held by the drives are replaced up to
``drives_held_max`` of them (their shares, or ``size`` with one database: past that, more
threads would only queue on the one drive). A thread whose task returns while more than ``size``
are free ends. A long task on a healthy drive may start one too, which only adds a thread while
it runs.

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
    reads_client: bool  # held, it waits on its client's memory rather than on a drive


class IoThreads:
    def __init__(
        self,
        size: int,
        drives_held_max: int,
        scheduler: Scheduler,
        stopping: threading.Event,
    ) -> None:
        self.size = size
        self._drives_held_max = drives_held_max
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
        """Start a thread for each held one that leaves fewer than ``size`` free, within what
        replaces held threads (the module's doc); none once stopping."""
        with self._lock:
            if self._stopping.is_set():
                return
            now = time.monotonic()
            held_by_clients = len(self._held(now, reads_client=True))
            held_by_drives = len(self._held(now, reads_client=False))
            most = self.size + held_by_clients + min(held_by_drives, self._drives_held_max)
            for _ in range(min(self.size - self._free(now), most - len(self._threads))):
                if not self._add():
                    return

    def threads(self) -> list[threading.Thread]:
        """The threads alive now (after ``stopping`` is set, no more start)."""
        with self._lock:
            return list(self._threads.values())

    def state(self) -> IoThreadsState:
        with self._lock:
            return IoThreadsState(self.size, len(self._threads), len(self._held(time.monotonic())))

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

    def _held(self, now: float, reads_client: bool | None = None) -> list[_Running]:
        """Under the lock: the tasks running for HELD_S or more (those that read a client's
        memory, or those that do not, or all)."""
        return [
            task
            for task in self._running.values()
            if now - task.since >= HELD_S
            and (reads_client is None or task.reads_client == reads_client)
        ]

    def _free(self, now: float) -> int:
        """Under the lock: the threads alive and not held (idle, or running a young task)."""
        return len(self._threads) - len(self._held(now))

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
