"""The scheduler decides which queued task an I/O thread runs next. It does no I/O.

Policy: loads before stores before deletes (a returning prompt waits on loads; a store can be
dropped by a cache). Within a class, sessions take turns, so one client flooding stores does not
starve another's. Admission control: while the bytes of queued stores exceed
``store_backlog_bytes_max``, new stores are refused at once (the plugin reports a failed store
and LMCache keeps the chunk in L1) instead of holding LMCache's buffers for longer.
EXISTS never comes here: the session answers it from the index.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum


class Priority(IntEnum):
    LOAD = 0
    STORE = 1
    DELETE = 2


@dataclass
class Task:
    priority: Priority
    session_id: int
    deadline_ns: int
    data_bytes: int
    run: Callable[[], None] = field(repr=False)  # does the work and completes the op
    cancel: Callable[[int], None] = field(repr=False)  # completes the op with this Status


@dataclass(frozen=True)
class SchedulerStatistics:
    queued: tuple[int, ...]  # per priority
    store_backlog_bytes: int


class Scheduler:
    def __init__(self, store_backlog_bytes_max: int) -> None:
        self._store_backlog_bytes_max = store_backlog_bytes_max
        self._queues: list[OrderedDict[int, deque[Task]]] = [OrderedDict() for _ in Priority]
        self._store_backlog_bytes = 0
        self._ready = threading.Condition()
        self._closed = False

    def submit(self, task: Task) -> bool:
        """Queue ``task``; False when refused (store backlog over its bound, or closed)."""
        with self._ready:
            if self._closed:
                return False
            if task.priority == Priority.STORE:
                backlog = self._store_backlog_bytes + task.data_bytes
                if self._store_backlog_bytes and backlog > self._store_backlog_bytes_max:
                    return False
                self._store_backlog_bytes = backlog
            self._queues[task.priority].setdefault(task.session_id, deque()).append(task)
            self._ready.notify()
            return True

    def next(self, timeout_s: float) -> Task | None:
        """The next task to run, waiting up to ``timeout_s``; None on timeout or when closed."""
        with self._ready:
            task = self._pop()
            if task is None and not self._closed:
                self._ready.wait(timeout_s)
                task = self._pop()
            return task

    def drop_session(self, session_id: int) -> list[Task]:
        """Remove and return every queued task of a session that went away."""
        with self._ready:
            dropped: list[Task] = []
            for queues in self._queues:
                dropped.extend(queues.pop(session_id, ()))
            self._release(dropped)
            return dropped

    def close(self) -> list[Task]:
        """Refuse new tasks and return every queued one."""
        with self._ready:
            self._closed = True
            dropped = [t for queues in self._queues for q in queues.values() for t in q]
            for queues in self._queues:
                queues.clear()
            self._release(dropped)
            self._ready.notify_all()
            return dropped

    def statistics(self) -> SchedulerStatistics:
        with self._ready:
            queued = tuple(sum(len(q) for q in queues.values()) for queues in self._queues)
            return SchedulerStatistics(queued, self._store_backlog_bytes)

    def _pop(self) -> Task | None:
        for queues in self._queues:
            if not queues:
                continue
            session_id, queue = next(iter(queues.items()))
            task = queue.popleft()
            del queues[session_id]
            if queue:
                queues[session_id] = queue  # to the back: the next session takes its turn
            self._release([task])
            return task
        return None

    def _release(self, tasks: list[Task]) -> None:
        self._store_backlog_bytes -= sum(
            t.data_bytes for t in tasks if t.priority == Priority.STORE
        )
