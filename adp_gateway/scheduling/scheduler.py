"""The scheduler decides which queued task an I/O thread runs next. It does no I/O.

Policy: loads before stores before deletes (a returning prompt waits on loads; a store can be
dropped by a cache). Within a class, sessions take turns, so one client flooding stores does not
starve another's. A store waits for its turn until its deadline: LMCache holds its bytes in L1
meanwhile, and each session's slots bound how many it has queued. Only where the config sets
``store_backlog_max`` are stores beyond that many queued bytes refused at once.
EXISTS never comes here: the session answers it from the index.

Write depth: stores writing at once may hold at most what the databases drain in 25 ms at the
rate stores were last seen to write, 64 MiB at least (write_depth.py), or ``store_inflight_max``
bytes where the config fixes it (one store always may run). A load that arrives then finds free
I/O threads and, at the device, queues behind that much writing at most, instead of behind every
store the I/O threads could hold. While a load
runs or waits, writes to its databases yield further: a store to them starts only when no other
store is writing there, so the disk serves the load beside one store's writes at most (and a
database stalled with a load and a store on it holds up no store to another). A store
whose writes have landed (``writes_landed``, called from inside its task) stops counting while
it waits for its group commit, so the next store's writes go to the disk meanwhile. So does a
store past its deadline that has been writing for ``STALLED_WRITE_S`` (``drop_expired``): the
depth is milliseconds of the drives' work, so such a store is held by a device that does not
answer, not queued before anyone's load, and its client has given it up. Counted, a database
stalled under a few large stores held up every store to the others.

Waking: an I/O thread that finishes a task takes the next itself; idle threads are woken only
as many as there are queued tasks, never all of them for nothing.

Stall containment: each task names the databases its I/O touches, and at most
``per_database_max`` running tasks may touch any one database. A database that stalls for
seconds then holds only that many I/O threads; tasks for the other databases go ahead of the
ones waiting for it, and a task whose deadline has passed is handed out at once (it completes as
expired without I/O).

Stalled clients are contained the same way: a task that reads the client's own memory (a store
from its L1, zero-copy or remote copy) waits on that client's pages, which a client can keep
from answering (its memory registered with userfaultfd, or a segment on a FUSE or NFS file).
At most ``per_client_reads_max`` such tasks of one session run at once, so one such client
holds only that many I/O threads and leaves the rest to the other sessions. ``statistics`` counts
the sessions and databases that hold their whole share now, so an operator sees one stall.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum

from adp_gateway.scheduling.write_depth import WriteDepth
from adp_wire.protocol import Status

# A store writing this long is stalled: the write depth holds milliseconds of the drives' work.
STALLED_WRITE_S = 1.0


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
    cancel: Callable[[Status], None] = field(repr=False)  # completes the op with this status
    databases: frozenset[int] = frozenset()  # what its I/O touches
    reads_client: bool = False  # it reads the client's memory (L1, zero-copy or remote copy)
    # Of its bytes, those counted against the write depth now (while a store writes), and since
    # when.
    writing_bytes: int = field(default=0, init=False, repr=False)
    writing_since_ns: int = field(default=0, init=False, repr=False)


@dataclass(frozen=True)
class SchedulerStatistics:
    queued: tuple[int, ...]  # per priority
    store_backlog_bytes: int
    write_depth_bytes: int  # the bytes of stores that may write at once now
    # Those holding every I/O thread they may: sessions by reads of their client's memory,
    # databases by their ops (a client or a drive that does not answer, or a flood).
    sessions_at_share: int
    databases_at_share: int


class Scheduler:
    def __init__(
        self,
        store_backlog_max: int | None = None,
        per_database_max: int | None = None,
        store_inflight_max: int | None = None,
        on_load: Callable[[], None] | None = None,
        per_client_reads_max: int | None = None,
    ) -> None:
        self._store_backlog_max = store_backlog_max
        self._on_load = on_load  # called with each load it queued (adp_gateway/host/priority.py)
        self._per_database_max = per_database_max
        self._per_client_reads_max = per_client_reads_max
        self._client_reads: Counter[int] = Counter()  # session -> running tasks reading it
        self._depth = WriteDepth(store_inflight_max)
        self._store_running_bytes = 0
        self._running: Counter[int] = Counter()  # database -> running tasks touching it
        # Per database (None: a task that names none, as if on every one): loads queued or
        # running, and stores writing. A load yields writes only on the databases it reads.
        self._loads_on: Counter[int | None] = Counter()
        self._writing_on: Counter[int | None] = Counter()
        self._writing: dict[int, Task] = {}  # id -> a store counted against the depth
        self._queues: list[OrderedDict[int, deque[Task]]] = [OrderedDict() for _ in Priority]
        self._store_backlog_bytes = 0
        self._stores_since: dict[int, int] = {}  # id of a store queued or running -> its submit
        self._queued = 0
        self._ready = threading.Condition()
        self._closed = False
        self._current = threading.local()  # the task each I/O thread runs, from next to finished

    def submit(self, task: Task) -> bool:
        """Queue ``task``; False when refused (store backlog over its bound, or closed)."""
        with self._ready:
            if self._closed:
                return False
            if task.priority == Priority.STORE:
                backlog = self._store_backlog_bytes + task.data_bytes
                limit = self._store_backlog_max
                if limit is not None and self._store_backlog_bytes and backlog > limit:
                    return False
                self._store_backlog_bytes = backlog
                self._stores_since[id(task)] = time.monotonic_ns()
            self._queues[task.priority].setdefault(task.session_id, deque()).append(task)
            self._queued += 1
            if task.priority == Priority.LOAD:
                self._loads_on.update(_places(task))
            self._ready.notify()
        if task.priority == Priority.LOAD and self._on_load is not None:
            self._on_load()  # after the load is queued, and outside the lock
        return True

    def loads_pending(self) -> bool:
        """Whether a load runs or waits."""
        with self._ready:
            return self._loading()

    def store_waited_s(self) -> float:
        """How long the store queued or running longest has been at it (0 with none): a
        gateway starved of CPU by busier processes shows it first (adp_gateway/host/priority.py)."""
        with self._ready:
            oldest = min(self._stores_since.values(), default=None)
        return 0.0 if oldest is None else (time.monotonic_ns() - oldest) / 1e9

    def next(self, timeout_s: float) -> Task | None:
        """The next task to run, waiting up to ``timeout_s``; None on timeout or when closed.
        The caller runs it, then calls ``finished``."""
        with self._ready:
            task = self._pop()
            if task is None and not self._closed:
                self._ready.wait(timeout_s)
                task = self._pop()
            self._current.task = task
            return task

    def writes_landed(self) -> None:
        """Called by the task this thread runs: a store's writes are on the device, so its
        bytes no longer count against the write depth (it may still wait for a sync), and the
        time they took tells the depth how fast the devices write."""
        task: Task | None = getattr(self._current, "task", None)
        if task is None or not task.writing_bytes:
            return
        with self._ready:
            self._depth.wrote(task.writing_bytes, task.writing_since_ns, time.monotonic_ns())
            self._stop_writing(task)
            self._wake()

    def finished(self, task: Task) -> None:
        """``task`` (from ``next``) is done: its databases may take another."""
        with self._ready:
            self._stores_since.pop(id(task), None)
            self._running.subtract(task.databases)
            if task.reads_client:
                self._client_reads[task.session_id] -= 1
                if not self._client_reads[task.session_id]:
                    del self._client_reads[task.session_id]
            if task.priority == Priority.LOAD:
                self._loads_on.subtract(_places(task))
            self._stop_writing(task)
            if getattr(self._current, "task", None) is task:
                self._current.task = None
            self._wake()

    def drop_session(self, session_id: int) -> list[Task]:
        """Remove and return every queued task of a session that went away."""
        with self._ready:
            dropped: list[Task] = []
            for queues in self._queues:
                dropped.extend(queues.pop(session_id, ()))
            self._release(dropped)
            self._wake()  # a store that waited on a dropped load may start now
            return dropped

    def drop_expired(self) -> list[Task]:
        """Remove and return every queued task whose deadline has passed, so that it completes
        (as expired) even while every I/O thread is busy or stalled; stores past theirs that
        are stalled in a write stop counting against the write depth."""
        now = time.monotonic_ns()
        with self._ready:
            stalled_since = now - int(STALLED_WRITE_S * 1e9)
            for store in [
                t
                for t in self._writing.values()
                if now > t.deadline_ns and t.writing_since_ns < stalled_since
            ]:
                self._stop_writing(store)
            dropped: list[Task] = []
            for queues in self._queues:
                for session_id, queue in list(queues.items()):
                    expired = [t for t in queue if now > t.deadline_ns]
                    if not expired:
                        continue
                    dropped.extend(expired)
                    kept = deque(t for t in queue if now <= t.deadline_ns)
                    if kept:
                        queues[session_id] = kept
                    else:
                        del queues[session_id]
            self._release(dropped)
            self._wake()
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
            depth = self._depth.limit()
            return SchedulerStatistics(
                queued,
                self._store_backlog_bytes,
                depth,
                _at_most(self._client_reads, self._per_client_reads_max),
                _at_most(self._running, self._per_database_max),
            )

    def _pop(self) -> Task | None:
        now = time.monotonic_ns()
        for queues in self._queues:
            for session_id, queue in queues.items():
                index = next((i for i, t in enumerate(queue) if self._may_start(t, now)), None)
                if index is None:
                    continue
                task = queue[index]
                del queue[index]
                del queues[session_id]
                if queue:
                    queues[session_id] = queue  # to the back: the next session takes its turn
                self._release([task], done=False)
                self._running.update(task.databases)
                if task.reads_client:
                    self._client_reads[task.session_id] += 1
                if task.priority == Priority.STORE and task.data_bytes:  # one of 0 writes nothing
                    task.writing_bytes = task.data_bytes
                    task.writing_since_ns = now
                    self._store_running_bytes += task.data_bytes
                    self._writing_on.update(_places(task))
                    self._writing[id(task)] = task
                return task
        return None

    def _may_start(self, task: Task, now: int) -> bool:
        if now > task.deadline_ns:
            return True
        if task.priority == Priority.STORE and self._store_running_bytes:
            if self._yields_to_a_load(task):
                return False  # writes yield to reads: one store writing at most, per database
            if self._store_running_bytes + task.data_bytes > self._depth.limit():
                return False
        readers = self._per_client_reads_max
        if (
            task.reads_client
            and readers is not None
            and self._client_reads[task.session_id] >= readers
        ):
            return False
        limit = self._per_database_max
        return limit is None or all(self._running[d] < limit for d in task.databases)

    def _yields_to_a_load(self, store: Task) -> bool:
        """Under the lock: whether a load runs or waits, and a store writes, on a database
        ``store`` writes to. Only there: a database stalled with a load and a store on it holds
        up no store to another."""
        places = [*_places(store), None]
        return any(self._loads_on[d] for d in places) and any(self._writing_on[d] for d in places)

    def _stop_writing(self, task: Task) -> None:
        """Under the lock: ``task``'s writes landed, or it ended."""
        if task.writing_bytes:
            self._store_running_bytes -= task.writing_bytes
            task.writing_bytes = 0
            self._writing_on.subtract(_places(task))
            del self._writing[id(task)]

    def _loading(self) -> bool:
        """Under the lock: whether a load runs or waits."""
        return any(count > 0 for count in self._loads_on.values())

    def _release(self, tasks: list[Task], done: bool = True) -> None:
        """Under the lock: ``tasks`` left the queues, done with (dropped) or, not ``done``,
        handed to an I/O thread."""
        if done:
            for task in tasks:
                self._stores_since.pop(id(task), None)
                if task.priority == Priority.LOAD:
                    self._loads_on.subtract(_places(task))
        self._queued -= len(tasks)
        self._store_backlog_bytes -= sum(
            t.data_bytes for t in tasks if t.priority == Priority.STORE
        )

    def _wake(self) -> None:
        """Under the lock: room was freed; wake at most one idle thread per queued task (the
        caller, if an I/O thread, takes one itself when it next asks)."""
        if self._queued:
            self._ready.notify(self._queued)


def _at_most(running: Counter[int], share: int | None) -> int:
    """How many of ``running``'s holders hold their whole ``share`` (None: no share)."""
    return 0 if share is None else sum(1 for count in running.values() if count >= share)


def _places(task: Task) -> list[int | None]:
    """The databases ``task`` touches; [None] (every one) when it names none."""
    return list(task.databases) or [None]
