"""Goal: tasks that never return cost their own threads, never everyone's. The I/O threads take
the scheduler's tasks; once a task has held its thread for HELD_S, ``settle`` starts another
beside it, so that ``size`` threads stay free: each one held by a client's memory, and those
held by drives up to ``drives_held_max``, never past ``threads_max`` alive; when the held tasks
return, the pool shrinks back to ``size``; a thread that a failing task killed is replaced and
leaves no held count behind; and once stopping, no thread starts."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from adp_gateway.scheduling import io_threads as io_threads_module
from adp_gateway.scheduling.io_threads import IoThreads
from adp_gateway.scheduling.scheduler import Priority, Scheduler, Task
from tests.support import wait_until

HELD_S = 0.2  # shorter than the gateway's, so the test waits less


@pytest.fixture(autouse=True)
def quick_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(io_threads_module, "HELD_S", HELD_S)


@pytest.fixture
def stopping() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


def waiting(
    session: int, run: threading.Event, done: list[int], reads_client: bool = False
) -> Task:
    """A task that waits for ``run``: a load on a drive that does not answer, or with
    ``reads_client`` a store from a client's memory that does not."""
    deadline_ns = time.monotonic_ns() + 60 * 10**9

    def body() -> None:
        run.wait(30)
        done.append(session)

    priority = Priority.STORE if reads_client else Priority.LOAD
    return Task(
        priority, session, deadline_ns, 0, body, lambda status: None, reads_client=reads_client
    )


def test_threads_held_by_drives_are_replaced_up_to_drives_held_max(
    stopping: threading.Event,
) -> None:
    scheduler = Scheduler(10**9)
    pool = IoThreads(2, scheduler, stopping, drives_held_max=1, threads_max=100)
    pool.start()
    stalled, done = threading.Event(), []
    for _ in range(2):
        scheduler.submit(waiting(1, stalled, done))
    wait_until(lambda: pool.state().held == 2, 5, "both threads held")
    pool.settle()  # one starts: drives_held_max 1 replaces one of the two
    pool.settle()
    assert pool.state().alive == 3
    load_runs_then_pool_shrinks(pool, scheduler, stalled, done, session=2)
    assert sorted(done) == [1, 1, 2] and pool.state().held == 0


def test_every_thread_held_by_a_client_is_replaced(stopping: threading.Event) -> None:
    """Three stalled clients' stores hold five threads of a pool of two, each session at most
    its share of two: five start beside them, and none for a drive past drives_held_max."""
    scheduler = Scheduler(10**9, per_client_reads_max=2)
    pool = IoThreads(2, scheduler, stopping, drives_held_max=0, threads_max=100)
    pool.start()
    stalled, done = threading.Event(), []
    for session in (1, 1, 1, 2, 2, 3):  # session 1's third waits for one of its two to return
        scheduler.submit(waiting(session, stalled, done, reads_client=True))
    wait_until(settled_with(pool, held=5), 5, "every store its share allows held")
    pool.settle()
    assert pool.state().alive == 7
    scheduler.submit(waiting(4, stalled, done))  # on a drive that stalls too
    wait_until(lambda: pool.state().held == 6, 5, "the drive's load held")
    pool.settle()
    assert pool.state().alive == 7  # drives_held_max 0: none replaces it
    load_runs_then_pool_shrinks(pool, scheduler, stalled, done, session=5)
    assert sorted(done) == [1, 1, 1, 2, 2, 3, 4, 5]


def test_no_thread_starts_past_threads_max(stopping: threading.Event) -> None:
    """A client that reconnects while its stores are stuck has a new session, with a new
    share: only threads_max bounds what its stuck stores hold."""
    scheduler = Scheduler(10**9, per_client_reads_max=1)
    pool = IoThreads(2, scheduler, stopping, drives_held_max=0, threads_max=4)
    pool.start()
    stalled, done = threading.Event(), []
    for session in range(1, 6):  # five sessions of one client, each with its store stuck
        scheduler.submit(waiting(session, stalled, done, reads_client=True))
    wait_until(settled_with(pool, held=4), 5, "the stores held, up to threads_max")
    pool.settle()
    assert pool.state().alive == 4
    stalled.set()
    wait_until(lambda: sorted(done) == [1, 2, 3, 4, 5], 5, "every store done")
    wait_until(lambda: pool.state().alive == 2, 5, "the pool back to its size")


def settled_with(pool: IoThreads, held: int) -> Callable[[], bool]:
    """A condition that settles the pool, then asks whether ``held`` threads are held."""

    def condition() -> bool:
        pool.settle()
        return pool.state().held == held

    return condition


def load_runs_then_pool_shrinks(
    pool: IoThreads, scheduler: Scheduler, stalled: threading.Event, done: list[int], session: int
) -> None:
    """Another session's load runs on a free thread beside the held ones; once the stalled
    tasks return, the pool is back to its size."""
    free = threading.Event()
    free.set()
    scheduler.submit(waiting(session, free, done))
    wait_until(lambda: session in done, 5, "another session's load on a free thread")
    stalled.set()
    wait_until(lambda: pool.state().alive == pool.size, 5, "the pool back to its size")


def test_only_enough_threads_start_to_keep_size_free(stopping: threading.Event) -> None:
    scheduler = Scheduler(10**9)
    pool = IoThreads(3, scheduler, stopping, drives_held_max=3, threads_max=100)
    pool.start()
    stalled, done = threading.Event(), []
    scheduler.submit(waiting(1, stalled, done))
    wait_until(lambda: pool.state().held == 1, 5, "one thread held")
    pool.settle()  # two of three are free: below the size, one starts
    assert pool.state().alive == 4
    pool.settle()
    assert pool.state().alive == 4
    stalled.set()
    wait_until(lambda: pool.state().alive == 3, 5, "the pool back to its size")


def test_no_thread_starts_once_stopping(stopping: threading.Event) -> None:
    scheduler = Scheduler(10**9)
    pool = IoThreads(1, scheduler, stopping, drives_held_max=1, threads_max=100)
    pool.start()
    stalled = threading.Event()
    scheduler.submit(waiting(1, stalled, []))
    wait_until(lambda: pool.state().held == 1, 5, "the thread held")
    stopping.set()
    pool.settle()
    assert pool.state().alive == 1 and len(pool.threads()) == 1
    stalled.set()
    for thread in pool.threads():
        thread.join(5)
    assert pool.state().alive == 0


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_thread_a_failing_task_killed_is_replaced(stopping: threading.Event) -> None:
    """A task whose run and whose failure report both raise ends its thread (run_task re-raises
    what the report raised); ``settle`` starts another, and nothing stays counted as held."""
    scheduler = Scheduler(10**9)
    pool = IoThreads(2, scheduler, stopping, drives_held_max=2, threads_max=100)
    pool.start()

    def fail(status: object = None) -> None:
        time.sleep(2 * HELD_S)  # long enough to count as held first
        raise RuntimeError("a bug")

    deadline_ns = time.monotonic_ns() + 60 * 10**9
    scheduler.submit(Task(Priority.LOAD, 1, deadline_ns, 0, fail, fail))
    wait_until(lambda: pool.state().alive == 1, 10, "the failing task's thread gone")
    assert pool.state().held == 0
    pool.settle()
    assert pool.state().alive == 2
    free, done = threading.Event(), []
    free.set()
    scheduler.submit(waiting(2, free, done))
    wait_until(lambda: done == [2], 5, "a load on the threads left")
