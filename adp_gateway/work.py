"""A session's work for the I/O threads: its stores, deletes and groups of loads, each a scheduler
task that ends by completing its ops (``Complete``, the session's ``complete``), whatever happens:
done, missed, failed on a storage error, expired before it started, or refused or cancelled by
the scheduler.

Zero-copy stores read the client's L1 pages (through the kernel only) inside the session's
``L1Readers``, which the session closes before it closes its socket: a client that sees EOF knows
the gateway has let go of its L1 (docs/design.md, "Zero-copy stores").
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Protocol

from adp_gateway.errors import StorageError, StoreGivenUp
from adp_gateway.extents import L1Object
from adp_gateway.loads import Load
from adp_gateway.metrics import Metrics
from adp_gateway.objects.store import ObjectStore
from adp_gateway.scheduler import Priority, Scheduler, Task
from adp_wire.protocol import Op, Status
from adp_wire.ring.layout import Submission
from adp_wire.trace import Stage, mark

log = logging.getLogger(__name__)
_PRIORITY = {Op.GET: Priority.LOAD, Op.SET: Priority.STORE, Op.DELETE: Priority.DELETE}
# What an op's work reports: status, per-key result bytes in the arena, the object's length, how
# many of its keys were found (a hit, a store done, a key deleted), and its summary counts.
Outcome = tuple[Status, int, int, int, dict[str, int] | None]
_EXPIRED: Outcome = (Status.EXPIRED, 0, 0, 0, None)
_FAILED: Outcome = (Status.FAILED, 0, 0, 0, None)


class Complete(Protocol):
    def __call__(
        self,
        submission: Submission,
        status: Status,
        result_bytes: int = 0,
        data_bytes: int = 0,
        hits: int = 1,
        counted: dict[str, int] | None = None,
    ) -> None: ...


class L1Readers:
    """Counts zero-copy stores in while the kernel reads their L1 pages; once closed, none
    starts, and ``close`` returns when the last one inside has left."""

    def __init__(self) -> None:
        self._idle = threading.Condition()
        self._inside = 0
        self._closed = False

    @contextlib.contextmanager
    def reading(self) -> Iterator[bool]:
        """Yield False (do not start) once closing: the client may already see EOF."""
        with self._idle:
            closed = self._closed
            self._inside += not closed
        if closed:
            yield False
            return
        try:
            yield True
        finally:
            with self._idle:
                self._inside -= 1
                self._idle.notify_all()

    @property
    def closing(self) -> bool:
        """The session is closing: its client is gone, or going."""
        return self._closed

    def close(self) -> None:
        with self._idle:
            self._closed = True
            self._idle.wait_for(lambda: self._inside == 0)


class SessionWork:
    def __init__(
        self,
        session_id: int,
        tenant: str,
        name: str,
        store: ObjectStore,
        scheduler: Scheduler,
        metrics: Metrics,
        complete: Complete,
        l1_readers: L1Readers,
    ) -> None:
        self._session_id = session_id
        self._tenant = tenant
        self._name = name
        self._store = store
        self._scheduler = scheduler
        self._metrics = metrics
        self._complete = complete
        self._l1_readers = l1_readers

    def store(
        self,
        submission: Submission,
        key: str,
        extent: memoryview,
        l1: L1Object | None,
    ) -> None:
        """Queue a store of ``extent``: the window, or with ``l1`` the client's L1."""
        length = submission.data_bytes

        def put() -> Outcome:
            self._store.put(self._tenant, key, extent, length, l1)
            self._metrics.moved("written", self._tenant, length)
            return Status.OK, 0, 0, 1, {"stores": 1, "bytes_stored": length}

        databases = self._store.databases_to_store(self._tenant, key, length)
        self._queue(submission, length, put, databases, reads_l1=l1 is not None)

    def delete(self, submission: Submission, keys: list[str], arena: memoryview) -> None:
        """Queue a delete; its per-key results go to ``arena``."""
        self._queue(
            submission,
            0,
            lambda: results(arena, self._store.delete(self._tenant, keys)),
            self._store.databases_holding(self._tenant, keys),
        )

    def loads(self, group: list[Load]) -> None:
        """One task reads the group (card.get_many); each load completes on its own."""

        def run() -> None:
            mark(Stage.TASK, group[0].submission.op_id)
            now = time.monotonic_ns()
            live = []
            for load in group:
                if now > load.submission.deadline_ns:
                    self._complete(load.submission, Status.EXPIRED)
                else:
                    live.append(load)
            wanted = [(load.key, load.extent, load.object_bytes) for load in live]
            try:
                found = self._store.get_many(self._tenant, wanted)
            except StorageError as exc:
                log.error("%s: a load of %d objects failed: %s", self._name, len(live), exc)
                for load in live:
                    self._complete(load.submission, Status.FAILED)
                return
            for load, hit in zip(live, found, strict=True):
                size = load.object_bytes
                if hit:
                    self._metrics.moved("read", self._tenant, size)
                counted = {"loads": 1, "load_hits": int(hit), "bytes_loaded": size * hit}
                status = Status.OK if hit else Status.MISS
                self._complete(load.submission, status, 0, size, int(hit), counted)

        def cancel(status: Status) -> None:
            for load in group:
                self._complete(load.submission, status)

        task = Task(
            Priority.LOAD,
            self._session_id,
            min(load.submission.deadline_ns for load in group),
            sum(load.object_bytes for load in group),
            run,
            cancel,
            self._store.databases_holding(self._tenant, [load.key for load in group]),
        )
        if not self._scheduler.submit(task):
            cancel(Status.REJECTED)

    def _queue(
        self,
        submission: Submission,
        data_bytes: int,
        work: Callable[[], Outcome],
        databases: frozenset[int],
        reads_l1: bool = False,
    ) -> None:
        def run() -> None:
            mark(Stage.TASK, submission.op_id)
            if time.monotonic_ns() > submission.deadline_ns:
                self._complete(submission, Status.EXPIRED)
                return
            if not reads_l1:
                self._complete(submission, *self._attempt(submission, work))
                return
            with self._l1_readers.reading() as allowed:
                outcome = self._attempt(submission, work) if allowed else _EXPIRED
            self._complete(submission, *outcome)

        task = Task(
            _PRIORITY[Op(submission.op)],
            self._session_id,
            submission.deadline_ns,
            data_bytes,
            run,
            lambda status: self._complete(submission, status),
            databases,
        )
        if not self._scheduler.submit(task):
            self._complete(submission, Status.REJECTED)

    def _attempt(self, submission: Submission, work: Callable[[], Outcome]) -> Outcome:
        try:
            return work()
        except StorageError as exc:
            level = logging.WARNING if isinstance(exc, StoreGivenUp) else logging.ERROR
            log.log(level, "%s: op %d failed: %s", self._name, submission.op_id, exc)
            return _FAILED


def results(arena: memoryview, found: list[bool], counted: dict[str, int] | None = None) -> Outcome:
    """Per-key results written to the slot's arena, as an OK outcome."""
    arena[: len(found)] = bytes(found)
    return Status.OK, len(found), 0, sum(found), counted
