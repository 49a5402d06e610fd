"""Goal: a session checks every descriptor against its own state: a slot reused while in flight
or a window range outside the window is a protocol error, and completions reach the client."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import numpy as np
import pytest

from adp_gateway.card.software.devices.memory import MemoryDevice
from adp_gateway.errors import ProtocolError
from adp_gateway.observe.metrics import Metrics
from adp_gateway.scheduling.io_threads import run_task
from adp_gateway.scheduling.scheduler import Scheduler
from adp_gateway.sessions.session import Session
from adp_wire.protocol import Op, Status, encode_keys
from adp_wire.ring.layout import LOOKUPS, PAGE_BYTES, UNTAKEN, RingLayout, Submission, map_shared
from adp_wire.ring.queue import completion_consumer
from tests.support.fuzz_parsers import drain
from tests.support.storage import REGION, open_store

LAYOUT = RingLayout(slots=4, arena_bytes=64 * 2**10, window_bytes=8 * PAGE_BYTES)
FAR = 2**63


@pytest.fixture
def session() -> Iterator[tuple[Session, Scheduler, memoryview]]:
    store = open_store([MemoryDevice(4096 + 4 * REGION)])
    scheduler = Scheduler(10**9)  # no I/O threads: queued ops stay in flight
    ours, theirs = socket.socketpair()
    session = Session(1, ours, "t", "test", LAYOUT, store, scheduler, lambda s: None, Metrics())
    _, fds = session.welcome()
    client_memory = memoryview(map_shared(os.dup(fds[0]), LAYOUT))
    yield session, scheduler, client_memory
    session.close()
    theirs.close()


def submit(
    session: Session,
    memory: memoryview,
    op: Op,
    slot: int,
    keys: list[str],
    offset: int = 0,
    size: int = 0,
    deadline: int = FAR,
) -> Submission:
    payload = encode_keys(keys)
    arena = LAYOUT.arena(memory, slot)
    arena[: len(payload)] = payload
    entry = Submission(slot + 100, op, 0, 0, slot, len(payload), 0, deadline, offset, size)
    session.dispatch([entry])
    return entry


def test_slot_reused_while_in_flight_is_refused(
    session: tuple[Session, Scheduler, memoryview],
) -> None:
    s, _, memory = session
    submit(s, memory, Op.GET, 0, ["k"], 0, 4096)
    with pytest.raises(ProtocolError, match="in flight"):
        submit(s, memory, Op.GET, 0, ["k"], 4096, 4096)


@pytest.mark.parametrize(
    ("offset", "size"), [(100, 10), (7 * PAGE_BYTES, PAGE_BYTES + 1), (2**40, 1)]
)
def test_window_range_outside_the_window_is_refused(
    session: tuple[Session, Scheduler, memoryview], offset: int, size: int
) -> None:
    s, _, memory = session
    with pytest.raises(ProtocolError, match="window range"):
        submit(s, memory, Op.SET, 1, ["k"], offset, size)


def test_exists_is_answered_inline_and_expired_ops_complete_as_expired(
    session: tuple[Session, Scheduler, memoryview],
) -> None:
    s, scheduler, memory = session
    completions = completion_consumer(memory, LAYOUT)
    submit(s, memory, Op.EXISTS, 2, ["a", "b"])
    submit(s, memory, Op.GET, 3, ["a"], 0, 4096, deadline=1)
    got = completions.pop_all()
    assert [(c.slot, Status(c.status)) for c in got] == [(2, Status.OK), (3, Status.EXPIRED)]
    assert bytes(LAYOUT.arena(memory, 2)[:2]) == b"\x00\x00"
    assert scheduler.statistics().queued == (0, 0, 0)


def test_loads_behind_one_doorbell_are_read_as_one_task_each_completing_on_its_own(
    session: tuple[Session, Scheduler, memoryview],
) -> None:
    """loads.py: the session queues a doorbell's small loads as one group (one scheduler
    task, one card.get_many); each still gets its own completion, hit or miss, and its own
    bytes in its own window range."""
    s, scheduler, memory = session
    completions = completion_consumer(memory, LAYOUT)
    window = LAYOUT.window(memory)
    stored = {key: bytes([n + 1]) * PAGE_BYTES for n, key in enumerate(["a", "b"])}
    for slot, (key, data) in enumerate(stored.items()):
        window[slot * PAGE_BYTES : (slot + 1) * PAGE_BYTES] = data
        submit(s, memory, Op.SET, slot, [key], slot * PAGE_BYTES, PAGE_BYTES)
    drain(scheduler)
    assert {c.slot: Status(c.status) for c in completions.pop_all()} == {0: Status.OK, 1: Status.OK}
    window[: 3 * PAGE_BYTES] = bytes(3 * PAGE_BYTES)
    loads = [
        Submission(100 + slot, Op.GET, 0, 0, slot, 0, 0, FAR, slot * PAGE_BYTES, PAGE_BYTES)
        for slot in range(3)
    ]
    for slot, key in enumerate(["b", "absent", "a"]):
        payload = encode_keys([key])
        LAYOUT.arena(memory, slot)[: len(payload)] = payload
        loads[slot] = loads[slot]._replace(request_bytes=len(payload))
    s.dispatch(loads)
    assert scheduler.statistics().queued == (1, 0, 0)  # one task for the three loads
    drain(scheduler)
    got = {c.slot: Status(c.status) for c in completions.pop_all()}
    assert got == {0: Status.OK, 1: Status.MISS, 2: Status.OK}
    assert bytes(window[:PAGE_BYTES]) == stored["b"]
    assert bytes(window[2 * PAGE_BYTES : 3 * PAGE_BYTES]) == stored["a"]


def test_data_op_with_two_keys_is_refused(session: tuple[Session, Scheduler, memoryview]) -> None:
    s, _, memory = session
    with pytest.raises(ProtocolError, match="one key"):
        submit(s, memory, Op.SET, 0, ["a", "b"], 0, 10)


def test_lookups_the_client_answered_itself_are_counted_and_nonsense_is_not(
    session: tuple[Session, Scheduler, memoryview],
) -> None:
    """The plugin counts the lookups it answers from the presence table in the shared memory
    (LOOKUPS); the gateway adds each increase to its metrics once, and a count that makes no
    sense (more found than looked up, a counter going back) adds nothing and breaks nothing."""
    s, _, memory = session
    counts = np.frombuffer(memory, np.uint64, 2, LOOKUPS)
    metrics = s._metrics

    def looked_up() -> int:
        return metrics.snapshot().get("lookup_keys", 0)

    counts[:] = (10, 4)
    s.fold_client_counts()
    s.fold_client_counts()
    assert looked_up() == 10
    counts[:] = (12, 9)  # 2 more looked up, 5 more found: nonsense
    s.fold_client_counts()
    counts[:] = (5, 1)  # back: nonsense
    s.fold_client_counts()
    assert looked_up() == 10
    counts[:] = (20, 10)  # from the last count seen, (5, 1): 15 more, 9 of them found
    s.fold_client_counts()
    assert looked_up() == 25


def test_stores_the_client_did_not_take_are_counted_once_and_nonsense_is_not(
    session: tuple[Session, Scheduler, memoryview],
) -> None:
    """The plugin counts the stores it reported not stored in the shared memory (UNTAKEN);
    the gateway adds each increase to its metrics and the summary line once, and a count
    going back adds nothing."""
    s, _, memory = session
    counts = np.frombuffer(memory, np.uint64, 2, UNTAKEN)
    untaken = s._metrics.untaken_stores.labels(s.tenant)
    untaken_bytes = s._metrics.untaken_bytes.labels(s.tenant)

    counts[:] = (3, 3 * 2**20)
    s.fold_client_counts()
    s.fold_client_counts()
    assert (untaken._value.get(), untaken_bytes._value.get()) == (3, 3 * 2**20)
    counts[:] = (1, 2**20)  # back: nonsense
    s.fold_client_counts()
    assert untaken._value.get() == 3
    counts[:] = (5, 5 * 2**20)
    s.fold_client_counts()
    assert (untaken._value.get(), untaken_bytes._value.get()) == (5, 5 * 2**20)
    assert "5 stores not taken (5.0 MiB)" in s._summary.describe()


def test_a_task_that_fails_after_completing_some_loads_reports_each_load_once(
    session: tuple[Session, Scheduler, memoryview], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A load group whose first load completed and whose second then raises something other
    than a StorageError (a bug): the I/O thread cancels the task, which completes every load of
    the group again. The client must still see one completion per op, or it takes the
    duplicate for a protocol error and fails its whole session."""
    s, scheduler, memory = session
    completions = completion_consumer(memory, LAYOUT)
    loads = []
    for slot in (0, 1):
        payload = encode_keys([f"k{slot}"])
        LAYOUT.arena(memory, slot)[: len(payload)] = payload
        loads.append(Submission(100 + slot, Op.GET, 0, 0, slot, len(payload), 0, FAR, 0, 4096))
    s.dispatch(loads)  # one group, one task
    monkeypatch.setattr(s._store, "get_many", lambda *args: [True, True])
    tallied: list[int] = []

    def loaded(size: int, hit: bool) -> None:
        tallied.append(size)
        if len(tallied) == 2:
            raise RuntimeError("a bug on the way to the second completion")

    monkeypatch.setattr(s._summary, "loaded", loaded)
    task = scheduler.next(timeout_s=0)
    assert task is not None
    run_task(scheduler, task)  # what every I/O thread does with a task
    got = [(c.op_id, Status(c.status)) for c in completions.pop_all()]
    assert sorted(got) == [(100, Status.OK), (101, Status.FAILED)]


def test_a_client_that_leaves_more_completions_unread_than_it_has_slots_is_dropped() -> None:
    """It frees no slot before reading its completion, so more unread than slots means it
    reuses slots whose completions it never reads: the backlog would grow without end."""
    store = open_store([MemoryDevice(4096 + 4 * REGION)])
    ours, theirs = socket.socketpair()
    session = Session(
        1, ours, "t", "test", LAYOUT, store, Scheduler(10**9), lambda s: None, Metrics()
    )
    _, fds = session.welcome()
    memory = memoryview(map_shared(os.dup(fds[0]), LAYOUT))
    try:
        for _ in range(2):  # a full queue, then as many again: all still owed to the client
            for slot in range(LAYOUT.slots):
                submit(session, memory, Op.EXISTS, slot, ["k"])
        theirs.setblocking(False)
        with pytest.raises(BlockingIOError):
            theirs.recv(1)  # still connected
        submit(session, memory, Op.EXISTS, 0, ["k"])
        theirs.settimeout(5)
        assert theirs.recv(1) == b""  # dropped
    finally:
        session.close()
        theirs.close()
