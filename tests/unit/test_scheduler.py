"""Goal: loads run before stores before deletes, sessions take turns, the store backlog is
bounded by refusing new stores at once, and a stalled database holds at most its share of the
I/O threads while tasks for other databases go ahead, and running stores hold a bounded number
of bytes, one store's at most while a load runs or waits on their database (a database stalled
with a load and a store on it holds up no store to another). A client whose memory stalls the
tasks reading it holds at most its share of the threads too."""

from __future__ import annotations

import threading
import time

import pytest

from adp_gateway.scheduling import scheduler as scheduler_module
from adp_gateway.scheduling.scheduler import Priority, Scheduler, Task
from adp_gateway.scheduling.write_depth import DRAIN_S, FLOOR_BYTES, WriteDepth
from tests.support import wait_until


def task(
    priority: Priority, session: int, size: int = 0, log: list[str] | None = None, name: str = ""
) -> Task:
    return Task(
        priority,
        session,
        0,
        size,
        lambda: None,
        lambda status: log.append(f"{name}:{status}") if log is not None else None,
    )


def drain(scheduler: Scheduler) -> list[Task]:
    out = []
    while (t := scheduler.next(0)) is not None:
        out.append(t)
    return out


def test_loads_go_first_then_stores_then_deletes() -> None:
    scheduler = Scheduler(10**9)
    order = [task(Priority.DELETE, 1), task(Priority.STORE, 1, 10), task(Priority.LOAD, 1)]
    for t in order:
        assert scheduler.submit(t)
    assert [t.priority for t in drain(scheduler)] == [
        Priority.LOAD,
        Priority.STORE,
        Priority.DELETE,
    ]


def test_a_queued_load_is_announced_and_pending_until_it_finishes() -> None:
    """``on_load`` (the gateway's priority, adp_gateway/host/priority.py) hears of each load once it
    is queued; ``loads_pending`` holds while it waits or runs, and not for stores."""
    seen: list[bool] = []
    scheduler = Scheduler(10**9, on_load=lambda: seen.append(scheduler.loads_pending()))
    scheduler.submit(task(Priority.STORE, 1, 10))
    assert seen == [] and not scheduler.loads_pending()
    scheduler.submit(task(Priority.LOAD, 1))
    assert seen == [True]
    load = scheduler.next(0)
    assert load is not None and load.priority == Priority.LOAD
    assert scheduler.loads_pending()  # running
    scheduler.finished(load)
    assert not scheduler.loads_pending()  # the store still waits


def test_sessions_take_turns_within_a_class() -> None:
    scheduler = Scheduler(10**9)
    for _ in range(3):
        scheduler.submit(task(Priority.STORE, 1, 1))
    scheduler.submit(task(Priority.STORE, 2, 1))
    assert [t.session_id for t in drain(scheduler)] == [1, 2, 1, 1]


def test_store_backlog_is_bounded_but_loads_are_not() -> None:
    scheduler = Scheduler(100)
    assert scheduler.submit(task(Priority.STORE, 1, 60))
    assert not scheduler.submit(task(Priority.STORE, 1, 60))
    assert scheduler.submit(task(Priority.LOAD, 1, 10**9))
    assert scheduler.statistics().store_backlog_bytes == 60
    drain(scheduler)
    assert scheduler.statistics().store_backlog_bytes == 0
    assert scheduler.submit(task(Priority.STORE, 1, 60))


def test_a_single_store_larger_than_the_bound_is_admitted_when_idle() -> None:
    scheduler = Scheduler(100)
    assert scheduler.submit(task(Priority.STORE, 1, 500))


def test_dead_sessions_and_close_return_their_tasks() -> None:
    scheduler = Scheduler(10**9)
    scheduler.submit(task(Priority.STORE, 1, 5))
    scheduler.submit(task(Priority.LOAD, 2))
    assert len(scheduler.drop_session(1)) == 1
    assert scheduler.statistics().store_backlog_bytes == 0
    assert len(scheduler.close()) == 1
    assert not scheduler.submit(task(Priority.LOAD, 2))
    assert scheduler.next(0) is None


def on(databases: set[int], session: int = 1, deadline_s: float = 60) -> Task:
    deadline_ns = time.monotonic_ns() + int(deadline_s * 1e9)
    return Task(
        Priority.LOAD, session, deadline_ns, 0, lambda: None, lambda s: None, frozenset(databases)
    )


def test_a_stalled_database_holds_only_its_share_of_the_threads() -> None:
    scheduler = Scheduler(10**9, per_database_max=2)
    stuck = [on({0}) for _ in range(4)]
    later = [on({1}), on({0, 1}), on({1}, session=2)]
    for t in [*stuck, *later]:
        assert scheduler.submit(t)
    running = drain(scheduler)  # none finishes: database 0 is stalled
    assert running == [stuck[0], later[2], stuck[1], later[0]]
    assert scheduler.statistics().queued[Priority.LOAD] == 3
    assert scheduler.statistics().databases_at_share == 2  # both hold two: a stall shows
    scheduler.finished(stuck[0])
    assert drain(scheduler) == [stuck[2]]  # database 0 takes one more, still not {0, 1}
    for t in (stuck[1], stuck[2], later[0]):
        scheduler.finished(t)
    assert scheduler.statistics().databases_at_share == 0
    assert drain(scheduler) == [stuck[3], later[1]]


def reading_client(session: int, deadline_s: float = 60) -> Task:
    """A store that reads its client's memory (zero-copy or remote copy)."""
    deadline_ns = time.monotonic_ns() + int(deadline_s * 1e9)
    return Task(
        Priority.STORE, session, deadline_ns, 1, lambda: None, lambda s: None, reads_client=True
    )


def test_a_client_whose_memory_stalls_holds_only_its_share_of_the_threads() -> None:
    scheduler = Scheduler(10**9, store_inflight_max=10**9, per_client_reads_max=2)
    stuck = [reading_client(1) for _ in range(4)]
    others = [on({0}), reading_client(2), reading_client(1, deadline_s=-1)]
    for t in [*stuck, *others]:
        assert scheduler.submit(t)
    running = drain(scheduler)  # none finishes: client 1's pages never answer
    # its load, the other client's store, and its expired store (it runs no I/O) still go
    assert running == [others[0], stuck[0], others[1], stuck[1], others[2]]
    assert scheduler.statistics().sessions_at_share == 1  # client 1, not client 2
    scheduler.finished(others[1])  # another client's thread is freed: not client 1's to take
    scheduler.finished(others[2])  # client 1's expired store ends at once
    assert drain(scheduler) == []
    scheduler.finished(stuck[0])
    assert drain(scheduler) == [stuck[2]]
    for t in (stuck[1], stuck[2]):
        scheduler.finished(t)
    assert drain(scheduler) == [stuck[3]]
    assert scheduler.statistics().sessions_at_share == 0


def test_a_task_past_its_deadline_is_handed_out_to_expire_at_once() -> None:
    scheduler = Scheduler(10**9, per_database_max=1)
    first, expired = on({0}), on({0}, deadline_s=-1)
    scheduler.submit(first)
    scheduler.submit(expired)
    assert drain(scheduler) == [first, expired]


def test_stores_write_at_most_their_inflight_bytes_and_loads_pass_them() -> None:
    scheduler = Scheduler(10**9, store_inflight_max=100)

    def live(priority: Priority, size: int) -> Task:
        deadline_ns = time.monotonic_ns() + 60 * 10**9
        return Task(priority, 1, deadline_ns, size, lambda: None, lambda status: None)

    stores = [live(Priority.STORE, 40) for _ in range(3)]
    big = live(Priority.STORE, 500)
    for t in [*stores, big]:
        assert scheduler.submit(t)
    assert drain(scheduler) == stores[:2]  # 80 bytes running; a third would make 120
    load = live(Priority.LOAD, 40)
    scheduler.submit(load)
    assert drain(scheduler) == [load]  # loads are not held by the writes
    scheduler.finished(load)
    scheduler.finished(stores[0])
    assert drain(scheduler) == [stores[2]]
    for t in (stores[1], stores[2]):
        scheduler.finished(t)
    assert drain(scheduler) == [big]  # one store always may run, however large


def test_a_store_stalled_past_its_deadline_stops_holding_the_write_depth(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A store stuck in a stalled database's kernel past its deadline no longer keeps the
    stores to other databases from writing; one past its deadline that has not been writing
    for ``STALLED_WRITE_S`` still counts (a store started late on a healthy disk)."""
    monkeypatch.setattr(scheduler_module, "STALLED_WRITE_S", 1.0)
    scheduler = Scheduler(10**9, store_inflight_max=100)
    soon = time.monotonic_ns() + 200_000_000
    stuck = Task(Priority.STORE, 1, soon, 80, lambda: None, lambda s: None, frozenset({0}))
    later = Task(Priority.STORE, 2, soon + 60 * 10**9, 40, lambda: None, lambda s: None)
    for t in (stuck, later):
        assert scheduler.submit(t)
    assert drain(scheduler) == [stuck]  # 120 bytes would pass the depth
    wait_until(lambda: time.monotonic_ns() > soon, 5, "the stuck store's deadline")
    assert scheduler.drop_expired() == []  # nothing queued to drop
    assert drain(scheduler) == []  # past its deadline, but writing for less than 1 s
    time.sleep(1.0)
    assert scheduler.drop_expired() == []
    assert drain(scheduler) == [later]
    scheduler.finished(stuck)  # once it returns, it is not subtracted twice
    scheduler.finished(later)
    big = [live_store(60), live_store(60)]
    for t in big:
        assert scheduler.submit(t)
    assert drain(scheduler) == big[:1]  # the depth counts from zero again


def test_while_a_load_runs_or_waits_only_one_store_writes() -> None:
    scheduler = Scheduler(10**9, store_inflight_max=100)
    stores = [live_store(10) for _ in range(4)]
    for t in stores:
        assert scheduler.submit(t)
    assert scheduler.next(0) is stores[0]
    load = Task(Priority.LOAD, 2, time.monotonic_ns() + 60 * 10**9, 10, lambda: None, print)
    assert scheduler.submit(load)
    assert scheduler.next(0) is load
    assert scheduler.next(0) is None  # stores[0] writes; the depth would allow more, the load not
    scheduler.finished(stores[0])
    assert scheduler.next(0) is stores[1]  # one store may always write
    assert scheduler.next(0) is None
    scheduler.finished(load)
    assert drain(scheduler) == stores[2:]  # no load: back to the write depth
    for t in stores[1:]:
        scheduler.finished(t)
    other = live_store(10)
    assert scheduler.submit(other) and scheduler.submit(load)
    assert drain(scheduler) == [load, other]


def test_queued_tasks_past_their_deadline_are_dropped_without_a_thread() -> None:
    scheduler = Scheduler(10**9)
    late, alive = on({0}, deadline_s=-1), on({0}, session=2)
    late_store = Task(Priority.STORE, 1, 0, 50, lambda: None, lambda status: None)
    for t in (late, alive, late_store):
        assert scheduler.submit(t)
    assert scheduler.drop_expired() == [late, late_store]
    assert scheduler.statistics().store_backlog_bytes == 0  # its bytes are given back
    assert drain(scheduler) == [alive]


def live_store(size: int) -> Task:
    deadline_ns = time.monotonic_ns() + 60 * 10**9
    return Task(Priority.STORE, 1, deadline_ns, size, lambda: None, lambda status: None)


def test_a_store_waiting_for_its_sync_lets_the_next_store_write() -> None:
    """Once a store's writes have landed it may wait for its group commit, but its bytes no
    longer hold back the next store's writes; they are not given back twice either."""
    scheduler = Scheduler(10**9, store_inflight_max=64)
    stores = [live_store(48) for _ in range(3)]
    for t in stores:
        assert scheduler.submit(t)
    assert scheduler.next(0) is stores[0]
    scheduler.writes_landed()  # called from inside stores[0], by the thread running it
    assert scheduler.next(0) is stores[1]
    assert scheduler.next(0) is None  # stores[1] writes 48; another 48 would make 96
    scheduler.finished(stores[0])
    assert scheduler.next(0) is None  # stores[0]'s bytes were given back once already
    scheduler.finished(stores[1])
    assert scheduler.next(0) is stores[2]


def test_a_finished_task_wakes_no_idle_thread_when_nothing_is_queued() -> None:
    """An idle I/O thread sleeps until there is work or its timeout: finishing a task with an
    empty queue does not wake every idle thread for nothing."""
    scheduler = Scheduler(10**9)
    load = on({0})
    scheduler.submit(load)
    assert scheduler.next(0) is load
    returned: list[float] = []

    def idle() -> None:
        started = time.monotonic()
        scheduler.next(timeout_s=0.5)
        returned.append(time.monotonic() - started)

    thread = threading.Thread(target=idle)
    thread.start()
    wait_until(lambda: len(scheduler._ready._waiters) == 1, 10, "the idle thread to wait")  # type: ignore[attr-defined]
    scheduler.finished(load)
    thread.join(10)
    assert returned and returned[0] >= 0.45, "the idle thread was woken with nothing to do"


def test_the_longest_wait_of_a_store_counts_it_queued_and_running_until_it_ends() -> None:
    """``store_waited_s`` is how long the oldest store not yet finished has been at it, queued
    or running (a gateway starved of CPU shows it there first), and forgets a store once it
    finishes or is dropped; loads and deletes do not count."""
    scheduler = Scheduler()
    assert scheduler.store_waited_s() == 0.0
    first, second = live_store(10), live_store(10)
    assert scheduler.submit(task(Priority.LOAD, 1)) and scheduler.submit(first)
    time.sleep(0.05)
    assert scheduler.submit(second)
    assert scheduler.store_waited_s() >= 0.05
    running = [scheduler.next(0), scheduler.next(0)]  # the load, then the first store
    assert running[1] is first and scheduler.store_waited_s() >= 0.05  # running counts too
    for t in running:
        assert t is not None
        scheduler.finished(t)
    assert 0 < scheduler.store_waited_s() < 0.05  # the second store's wait alone
    assert scheduler.drop_session(1) == [second]
    assert scheduler.store_waited_s() == 0.0


def test_the_write_depth_follows_the_rate_stores_write_at_and_a_fixed_one_does_not() -> None:
    """By default the bytes of stores that may write at once are what the devices drain in
    DRAIN_S at the rate the last stores wrote (their bytes over the time some store wrote),
    never below FLOOR_BYTES: a 28 GB/s drive gets the depth it needs, a slow disk keeps loads'
    wait short. A configured store_inflight_max stays what it is."""
    ms = 10**6
    fast, slow, fixed = WriteDepth(), WriteDepth(), WriteDepth(100 * 2**20)
    for i in range(20):  # two 32 MiB stores side by side every 5 ms: 12.8 GB/s
        for depth in (fast, fixed):
            depth.wrote(32 * 2**20, i * 5 * ms, (i + 1) * 5 * ms)
            depth.wrote(32 * 2**20, i * 5 * ms, (i + 1) * 5 * ms)
        slow.wrote(32 * 2**20, i * 50 * ms, (i + 1) * 50 * ms)  # 0.67 GB/s
    assert fast.rate_bytes_per_s() == pytest.approx(64 * 2**20 / 0.005)
    # 25 ms of it, 335 MB, as last worked out (at most every RECOMPUTE_NS)
    assert fast.limit() == pytest.approx(64 * 2**20 / 0.005 * DRAIN_S, rel=0.05)
    assert slow.limit() == FLOOR_BYTES
    assert fixed.limit() == 100 * 2**20
    much_later = 10**9 * 100  # the window forgets old stores
    fast.wrote(4 * 2**20, much_later, much_later + 100 * ms)
    assert fast.limit() == FLOOR_BYTES


def test_stores_write_as_deep_as_the_depth_allows() -> None:
    scheduler = Scheduler()
    first, second, third = live_store(40 * 2**20), live_store(30 * 2**20), live_store(2**20)
    for t in (first, second, third):
        assert scheduler.submit(t)
    assert scheduler.next(0) is first
    assert scheduler.next(0) is third  # 70 MiB would write with the second: over 64 MiB
    assert scheduler.next(0) is None
    assert scheduler.statistics().write_depth_bytes == FLOOR_BYTES


def test_a_load_holds_writes_back_only_on_the_databases_it_reads() -> None:
    """Database 0 stalls with a store writing and a load reading: a store to database 1 still
    starts, and a second store to database 0 waits."""
    scheduler = Scheduler(10**9, per_database_max=6, store_inflight_max=2**30)
    deadline_ns = time.monotonic_ns() + 60 * 10**9

    def store(database: int) -> Task:
        return Task(Priority.STORE, 1, deadline_ns, 10, lambda: None, print, frozenset({database}))

    stuck_store, stuck_load = store(0), on({0})
    for t in (stuck_store, stuck_load):
        assert scheduler.submit(t)
    assert drain(scheduler) == [stuck_load, stuck_store]
    elsewhere, behind = store(1), store(0)
    assert scheduler.submit(behind) and scheduler.submit(elsewhere)
    assert drain(scheduler) == [elsewhere]
    scheduler.finished(stuck_load)
    assert drain(scheduler) == [behind]  # no load on database 0: back to the write depth
