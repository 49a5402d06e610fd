"""Goal: the plugin's window allocator never hands out overlapping extents, and its completion
queue resets the event fd in drain without ever losing a wakeup."""

from __future__ import annotations

import os
import random
import select
import threading

from lmcache_adp.completions import CompletionQueue
from lmcache_adp.window import WindowAllocator


def test_allocator_extents_never_overlap_and_all_space_returns() -> None:
    rng = random.Random(1)
    allocator = WindowAllocator(64 * 4096)
    live: dict[int, int] = {}
    for _ in range(2000):
        if live and rng.random() < 0.5:
            offset = rng.choice(list(live))
            allocator.release(offset, live.pop(offset))
            continue
        size = rng.randint(1, 9 * 4096)
        offset = allocator.allocate(size)
        if offset is None:
            continue
        assert offset % 4096 == 0 and offset + size <= allocator.window_bytes
        for other, other_size in live.items():
            assert offset + size <= other or other + other_size <= offset
        live[offset] = size
    for offset, size in live.items():
        allocator.release(offset, size)
    assert allocator.free_bytes == 64 * 4096
    assert allocator.allocate(64 * 4096) == 0


def readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def test_drain_resets_the_fd_and_tuples_have_the_required_shape() -> None:
    queue = CompletionQueue()
    queue.push(7, True, "", [1, 0])  # type: ignore[list-item]
    assert readable(queue.fd)
    items = queue.drain()
    assert items == [(7, True, "", [True, False])]
    assert all(type(b) is bool for b in items[0][3])  # type: ignore[union-attr]
    assert not readable(queue.fd)
    assert queue.drain() == []
    queue.close()


def test_no_wakeup_is_lost_under_concurrent_producers() -> None:
    queue = CompletionQueue()
    total = 20000
    got = 0

    def produce(start: int) -> None:
        for i in range(start, total, 4):
            queue.push(i, True, "", [])

    threads = [threading.Thread(target=produce, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    while got < total:  # as LMCache does: block on readiness, then drain
        assert select.select([queue.fd], [], [], 5)[0], "a wakeup was lost"
        got += len(queue.drain())
    for t in threads:
        t.join()
    assert got == total and not readable(queue.fd)
    os.close(os.dup(queue.fd))
    queue.close()
