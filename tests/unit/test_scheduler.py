"""Goal: loads run before stores before deletes, sessions take turns, and the store backlog is
bounded by refusing new stores at once."""

from __future__ import annotations

from gateway.scheduler import Priority, Scheduler, Task


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
