"""Goal: the plugin's window allocator never hands out overlapping extents, its completion queue
resets the event fd in drain without ever losing a wakeup, its inbox refuses rather than blocks
when full, its workers run a load's copy before queued copies of stores, its copier splits large
copies without losing or doubling a byte, and a lookup's keys are split into runs that each fit
an arena, cover every key the protocol carries once and in order, and leave out only keys too
long for it; a lookup never waits for a whole batch of stores to be posted; and reported
batches do not keep LMCache's buffers once the plugin has failed everything."""

from __future__ import annotations

import gc
import logging
import mmap
import os
import random
import select
import socket
import threading
import weakref

import msgpack
import numpy as np
import pytest

from adp_wire.protocol import ARENA_BYTES_MIN, KEY_BYTES_MAX, KEYS_PER_REQUEST_MAX, Op, Welcome
from adp_wire.ring import doorbell
from adp_wire.ring.layout import PAGE_BYTES, RingLayout, create_shared
from adp_wire.ring.queue import submission_consumer
from lmcache_adp.batch import Batch
from lmcache_adp.completions import CompletionQueue
from lmcache_adp.config import ADPParams
from lmcache_adp.copier import Copier
from lmcache_adp.ioloop import STORE_POSTS_PER_STEP, IOLoop
from lmcache_adp.l1_segment import L1Map
from lmcache_adp.lanes import RUN_BYTES_MAX, Lane, Lanes, key_runs
from lmcache_adp.link import GatewayLink
from lmcache_adp.outcomes import LINGERING_MAX, TIMEOUT_LINE_S, Outcomes, TimeoutLines
from lmcache_adp.shared import Inbox, Shared
from lmcache_adp.untaken import Untaken
from lmcache_adp.window import WindowAllocator
from lmcache_adp.workers import Workers


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


def test_a_full_inbox_refuses_a_batch_at_once() -> None:
    wake = doorbell.new()
    inbox = Inbox(wake, capacity=2)
    batches = [Batch(i, Op.EXISTS, ["k"], None, 0) for i in range(3)]
    assert [inbox.put(b) for b in batches] == [True, True, False]
    assert inbox.take() is batches[0]
    assert inbox.put(batches[2])
    assert [inbox.take(), inbox.take(), inbox.take()] == [batches[1], batches[2], None]
    os.close(wake)


def test_copies_of_every_size_arrive_whole_and_unwanted_slices_never_start() -> None:
    copier = Copier(threads=4)
    rng = np.random.default_rng(3)
    results: list[tuple[int, bool]] = []
    done = threading.Event()
    sizes = [0, 1, 4095, 4096, 8 * 2**20 + 3, 33 * 2**20]
    pairs = []
    for size in sizes:
        source = memoryview(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
        pairs.append((source, memoryview(bytearray(size))))
    for size, (source, destination) in zip(sizes, pairs, strict=True):

        def finished(ok: bool, size: int = size) -> None:
            results.append((size, ok))
            if len(results) == len(sizes):
                done.set()

        copier.copy(destination, source, finished)
    assert done.wait(30)
    assert sorted(results) == sorted((size, True) for size in sizes)
    assert all(bytes(d) == bytes(s) for s, d in pairs)

    skipped: list[bool] = []
    untouched = memoryview(bytearray(16 * 2**20))
    copier.copy(untouched, pairs[-1][0][: 16 * 2**20], skipped.append, wanted=lambda: False)
    copier.close()
    assert skipped == [False] and not any(untouched)


def test_lookup_runs_fit_an_arena_and_cover_every_carried_key_in_order() -> None:
    rng = random.Random(7)
    alphabet = "abcdef0123456789@é漢"
    for trial in range(200):
        count = rng.choice([0, 1, 5, 999, 1000, KEYS_PER_REQUEST_MAX + 3])
        lengths = [rng.choice([1, 76, 400, KEY_BYTES_MAX // 3]) for _ in range(count)]
        if trial % 3 == 0 and count:  # some keys the protocol cannot carry, anywhere
            for _ in range(rng.randint(1, 4)):
                lengths[rng.randrange(count)] = KEY_BYTES_MAX + rng.randint(1, 50)
        ascii_only = trial % 2 == 0
        keys = [
            "".join(rng.choice(alphabet[:16] if ascii_only else alphabet) for _ in range(n))
            for n in lengths
        ]
        batch = Batch(trial, Op.EXISTS, keys, None, 0)
        covered: list[int] = []
        for request in key_runs(batch):
            assert 0 < len(request.keys) <= KEYS_PER_REQUEST_MAX
            assert len(request.payload) <= RUN_BYTES_MAX
            assert msgpack.unpackb(request.payload) == request.keys
            assert request.keys == keys[request.first : request.first + len(request.keys)]
            covered.extend(range(request.first, request.first + len(request.keys)))
        carried = [i for i, key in enumerate(keys) if len(key.encode()) <= KEY_BYTES_MAX]
        assert covered == carried


def test_lanes_count_each_batch_at_admission_and_hand_out_its_requests_in_order() -> None:
    """Admission bounds every request of a batch at once, though a batch's requests are made
    only as they reach the front: a key the protocol cannot carry neither counts nor goes.
    Stores are bounded by that count alone, never by their bytes: they wait for room."""
    lanes = Lanes(ADPParams(pending_ops_max=8))
    buffers = [memoryview(bytearray(PAGE_BYTES)) for _ in range(3)]
    stores = Batch(1, Op.SET, ["a", "x" * (KEY_BYTES_MAX + 1), "c"], buffers, 60)
    assert lanes.admit(stores) and stores.remaining == 2
    big = [memoryview(bytearray(64 * 2**20))]
    assert lanes.admit(Batch(2, Op.SET, ["big"], big, 60))  # 64 MiB more may wait
    lookup = Batch(3, Op.EXISTS, ["k1", "k2"], None, 60)
    assert lanes.admit(lookup) and lookup.remaining == 1
    loads = Batch(4, Op.GET, [f"g{i}" for i in range(4)], [buffers[0]] * 4, 60)
    assert lanes.admit(loads)  # 8 requests wait now: the bound
    assert not lanes.admit(Batch(5, Op.EXISTS, ["k3"], None, 60))
    front = lanes.head(Lane.STORE)
    assert front is not None and front.keys == ["a"] and lanes.pop(Lane.STORE) is front
    assert lanes.admit(Batch(7, Op.SET, ["f"], buffers[:1], 60))  # room for one more op
    drained = [(r.batch.future_id, r.keys, r.data_bytes) for r in lanes.drain()]
    assert drained == [
        (3, ["k1", "k2"], 0),
        *[(4, [f"g{i}"], PAGE_BYTES) for i in range(4)],
        (1, ["c"], PAGE_BYTES),
        (2, ["big"], 64 * 2**20),
        (7, ["f"], PAGE_BYTES),
    ]
    assert lanes.head(Lane.LOOKUP) is None


def test_urgent_jobs_overtake_queued_ones_and_close_runs_every_job() -> None:
    workers = Workers(1, "test")
    gate = threading.Event()
    order: list[str] = []
    workers.submit(gate.wait)  # holds the only thread while the others queue
    for name in ("store-1", "store-2"):
        workers.submit(lambda name=name: order.append(name))
    workers.submit(lambda: 1 / 0)  # a job that raises does not stop the thread
    workers.submit(lambda: order.append("load"), urgent=True)
    gate.set()
    workers.close()
    assert order == ["load", "store-1", "store-2"]


def test_a_buffer_in_l1_is_found_at_its_offset_whether_writable_or_not() -> None:
    segment = mmap.mmap(-1, 16 * PAGE_BYTES)
    whole = memoryview(segment)
    start = int(np.frombuffer(whole, np.uint8).ctypes.data)
    l1 = L1Map("/dev/shm/unused", start, len(segment))
    inside = whole[3 * PAGE_BYTES : 5 * PAGE_BYTES]
    assert l1.offset_of(inside) == 3 * PAGE_BYTES
    assert l1.offset_of(inside.toreadonly()) == 3 * PAGE_BYTES
    assert l1.offset_of(whole[100 : 100 + PAGE_BYTES]) is None  # not on a page: the copy path
    assert l1.offset_of(whole[:0]) is None
    elsewhere = memoryview(bytearray(PAGE_BYTES))
    assert l1.offset_of(elsewhere) is None
    shifted = L1Map("/dev/shm/unused", start + PAGE_BYTES, 2 * PAGE_BYTES)  # ends inside `inside`
    assert shifted.offset_of(inside) is None


def test_a_closed_inbox_refuses_batches_and_hands_back_the_queued_ones() -> None:
    wake = doorbell.new()
    inbox = Inbox(wake)
    batches = [Batch(i, Op.EXISTS, ["k"], None, 0) for i in range(3)]
    assert inbox.put(batches[0]) and inbox.put(batches[1])
    assert inbox.close() == batches[:2]
    assert not inbox.put(batches[2])
    assert inbox.take() is None and inbox.close() == []
    os.close(wake)


def test_shutdown_reports_the_batches_the_loop_never_took() -> None:
    """A submit whose batch is still in the inbox when the link's thread stops (it checks
    ``stopping`` between steps) is reported failed by the shutdown, never left unreported."""
    shared = Shared(ADPParams())
    loop = IOLoop(shared)
    batches = [Batch(i, Op.SET, [f"k{i}"], [memoryview(bytearray(8))], 60) for i in range(3)]
    assert all(shared.inbox.put(batch) for batch in batches)
    shared.stopping.set()
    loop.shutdown()
    reported = shared.completions.drain()
    assert sorted((future, ok) for future, ok, _, _ in reported) == [(i, False) for i in range(3)]
    assert not shared.inbox.put(Batch(3, Op.EXISTS, ["k"], None, 60))
    shared.completions.close()
    os.close(shared.wake)


def test_reported_batches_let_go_of_lmcaches_buffers() -> None:
    """A batch reported long before its deadline waits in the deadline heap. While the plugin
    runs, at most LINGERING_MAX of them stay there; once it fails everything, as it does when
    it closes, none does, so LMCache can unmap its L1 (without waiting for the collector of
    reference cycles, which holds the plugin's closed loop)."""
    completions = CompletionQueue()
    outcomes = Outcomes(completions, lambda batch: None, Untaken())
    l1 = mmap.mmap(-1, 64 * PAGE_BYTES)
    view = memoryview(l1)
    reported = []
    gc.disable()
    try:
        for i in range(2 * LINGERING_MAX):
            batch = Batch(i, Op.GET, [f"k{i}"], [view[i * 8 : i * 8 + 8]], 60)
            outcomes.track(batch)
            outcomes.conclude(batch)
            reported.append(weakref.ref(batch))
        del batch
        assert 0 < sum(ref() is not None for ref in reported) <= LINGERING_MAX
        outcomes.fail_all()
        assert all(ref() is None for ref in reported)
        view.release()
        l1.close()  # BufferError while a slice of it is still held
    finally:
        gc.enable()
    assert len(completions.drain()) == 2 * LINGERING_MAX
    completions.close()


def test_timed_out_batches_fold_into_one_line_per_op_and_window(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A hung gateway expires every batch: each op gets a line, then its next timeouts are
    counted into the next line after TIMEOUT_LINE_S."""
    lines = TimeoutLines()
    with caplog.at_level(logging.WARNING, logger="lmcache_adp"):
        for second in range(3):
            for i in range(100):
                lines.timed_out(Batch(i, Op.SET, ["k"], None, 1.0), second * 0.01)
        lines.timed_out(Batch(0, Op.GET, ["k", "l"], None, 1.0), 0.02)
        lines.timed_out(Batch(0, Op.SET, ["k"], None, 1.0), TIMEOUT_LINE_S)
    assert [r.getMessage() for r in caplog.records] == [
        "SET of 1 keys timed out after 1.0 s",
        "GET of 2 keys timed out after 1.0 s",
        "SET of 1 keys timed out after 1.0 s (and 299 more since the last such line)",
    ]


def test_a_lookup_reaches_the_gateway_between_the_stores_of_one_batch() -> None:
    """A step of the link's thread posts at most STORE_POSTS_PER_STEP stores, and takes new
    batches at the start of each, so an EXISTS submitted while a batch of stores is being posted
    goes on the ring before the rest of that batch, which follows in order."""
    layout = RingLayout(32, ARENA_BYTES_MIN, 32 * PAGE_BYTES)
    memfd, mapping = create_shared(layout)
    a, b = socket.socketpair()  # the gateway's end stays open and silent: the link is alive
    link = GatewayLink(
        a,
        Welcome(1, 32, ARENA_BYTES_MIN, 32 * PAGE_BYTES, PAGE_BYTES),
        [memfd, doorbell.new(), doorbell.new()],
    )
    ring = submission_consumer(memoryview(mapping), layout)
    shared = Shared(ADPParams())
    shared.new_links.append(link)
    loop = IOLoop(shared)
    stores = 2 * STORE_POSTS_PER_STEP + 2
    buffers = [memoryview(bytearray([i]) * PAGE_BYTES) for i in range(stores)]
    assert shared.inbox.put(Batch(1, Op.SET, [f"s{i}" for i in range(stores)], buffers, 60))
    steps = []
    loop._step()
    steps.append([entry.op for entry in ring.pop_all()])
    assert shared.inbox.put(Batch(2, Op.EXISTS, ["k"], None, 60))
    for _ in range(6):
        loop._wait()
        loop._step()
        steps.append([entry.op for entry in ring.pop_all()])
    assert all(step.count(Op.SET) <= STORE_POSTS_PER_STEP for step in steps)
    posted = [op for step in steps for op in step]
    first_turn = [Op.SET] * STORE_POSTS_PER_STEP
    assert posted == [*first_turn, Op.EXISTS, *[Op.SET] * (stores - STORE_POSTS_PER_STEP)]
    shared.stopping.set()
    loop.shutdown()
    assert {future for future, ok, _, _ in shared.completions.drain()} == {1, 2}
    shared.completions.close()
    os.close(shared.wake)
    b.close()
