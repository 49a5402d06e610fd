"""A session's work for the I/O threads: its stores, deletes and groups of loads, each a scheduler
task that ends by completing its ops (``Complete``, the session's ``complete``), whatever happens:
done, missed, failed on a storage error, expired before it started, or refused or cancelled by the
scheduler. A zero-copy store runs inside the session's ``L1Readers``
(adp_gateway/sessions/client_l1.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from adp_gateway.errors import StorageError, StoreGivenUp
from adp_gateway.objects.store import ObjectStore
from adp_gateway.observe.metrics import Metrics
from adp_gateway.scheduling.loads import Load
from adp_gateway.scheduling.scheduler import Priority, Scheduler, Task
from adp_gateway.sessions.client_l1 import L1Readers
from adp_gateway.sessions.extents import L1Object, RemoteObject
from adp_gateway.sessions.summary import Summary
from adp_wire.protocol import Op, Status
from adp_wire.ring.layout import Submission
from adp_wire.trace import Stage, mark

log = logging.getLogger(__name__)
_PRIORITY = {Op.GET: Priority.LOAD, Op.SET: Priority.STORE, Op.DELETE: Priority.DELETE}
# What an op's work reports: status, per-key result bytes in the arena, the object's length, and
# how many of its keys were found (a hit, a store done, a key deleted).
Outcome = tuple[Status, int, int, int]
_EXPIRED: Outcome = (Status.EXPIRED, 0, 0, 0)
_FAILED: Outcome = (Status.FAILED, 0, 0, 0)


class Complete(Protocol):
    def __call__(
        self,
        submission: Submission,
        status: Status,
        result_bytes: int = 0,
        data_bytes: int = 0,
        hits: int = 1,
    ) -> None: ...


class SessionWork:
    def __init__(
        self,
        session_id: int,
        tenant: str,
        name: str,
        store: ObjectStore,
        scheduler: Scheduler,
        metrics: Metrics,
        summary: Summary,
        complete: Complete,
        l1_readers: L1Readers,
    ) -> None:
        self._session_id = session_id
        self._tenant = tenant
        self._name = name
        self._store = store
        self._scheduler = scheduler
        self._metrics = metrics
        self._summary = summary
        self._complete = complete
        self._l1_readers = l1_readers

    def store(
        self,
        submission: Submission,
        key: str,
        extent: memoryview,
        l1: L1Object | RemoteObject | None,
    ) -> None:
        """Queue a store of ``extent``: the window, or with ``l1`` the client's L1 (a
        zero-copy store's pages, or a remote copy's buffer, copied into the window extent). A
        store admission declines is done at once (for a cache, stored and evicted)."""
        length = submission.data_bytes
        if not self._store.admit(self._tenant, key, length):
            self._complete(submission, Status.OK)
            return

        def put() -> Outcome:
            self._store.put(self._tenant, key, extent, length, l1)
            self._metrics.moved("written", self._tenant, length)
            self._summary.stored(length)
            return Status.OK, 0, 0, 1

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
                self._summary.loaded(size, hit)
                status = Status.OK if hit else Status.MISS
                self._complete(load.submission, status, 0, size, int(hit))

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
            reads_client=reads_l1,
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


def results(arena: memoryview, found: list[bool]) -> Outcome:
    """Per-key results written to the slot's arena, as an OK outcome."""
    arena[: len(found)] = bytes(found)
    return Status.OK, len(found), 0, sum(found)
