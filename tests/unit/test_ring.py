"""Goal: the shared-memory queues deliver entries in order, stop when full, and treat a peer's
impossible counters as a protocol error rather than reading out of bounds."""

from __future__ import annotations

import ctypes
import mmap
import os
import re
import signal
import struct
import time
from pathlib import Path

import pytest

from adp_gateway.errors import ProtocolError
from adp_wire.protocol import Op
from adp_wire.ring.layout import (
    PAGE_BYTES,
    SQ_HEAD,
    SQ_TAIL,
    RingLayout,
    Submission,
    create_shared,
    map_shared,
)
from adp_wire.ring.queue import (
    completion_consumer,
    completion_producer,
    submission_consumer,
    submission_producer,
)

LAYOUT = RingLayout(slots=4, arena_bytes=64 * 2**10, window_bytes=16 * PAGE_BYTES)


def shared() -> memoryview:
    return memoryview(mmap.mmap(-1, LAYOUT.total_bytes))


def entry(op_id: int) -> Submission:
    return Submission(op_id, Op.GET, 0, 0, op_id % 4, 10, 0, 123, 4096, 5000)


def test_entries_arrive_in_order_and_the_queue_stops_when_full() -> None:
    buf = shared()
    producer, consumer = submission_producer(buf, LAYOUT), submission_consumer(buf, LAYOUT)
    assert all(producer.push(entry(i)) for i in range(4))
    assert not producer.push(entry(4))
    assert consumer.pop_all() == [entry(i) for i in range(4)]
    assert producer.push(entry(4)) and consumer.pop_all() == [entry(4)]
    assert consumer.pop_all() == []


def test_completion_queue_round_trips() -> None:
    buf = shared()
    producer, consumer = completion_producer(buf, LAYOUT), completion_consumer(buf, LAYOUT)
    for _ in range(3):  # wraps around the ring
        for i in range(3):
            assert producer.push((i, i, 0, 0, 0, 2, 0, 77))  # type: ignore[arg-type]
        assert [c.op_id for c in consumer.pop_all()] == [0, 1, 2]


@pytest.mark.parametrize("tail", [5, 2**64 - 1])
def test_consumer_refuses_an_impossible_tail(tail: int) -> None:
    buf = shared()
    consumer = submission_consumer(buf, LAYOUT)
    struct.pack_into("<Q", buf, SQ_TAIL, tail)
    with pytest.raises(ProtocolError, match="tail"):
        consumer.pop_all()


def test_producer_refuses_a_head_ahead_of_its_tail() -> None:
    buf = shared()
    producer = completion_producer(buf, LAYOUT)
    struct.pack_into("<Q", buf, 192, 9)  # CQ_HEAD
    with pytest.raises(ProtocolError, match="head"):
        producer.push((1, 0, 0, 0, 0, 0, 0, 0))  # type: ignore[arg-type]


def test_a_producer_refuses_to_advance_its_counter_past_2_to_the_64() -> None:
    """A peer can hand over memory whose counters are near the top; the 64-bit counter must
    not be published past it (that raised ValueError, after writing the entry)."""
    buf = shared()
    for counter in (SQ_HEAD, SQ_TAIL):
        struct.pack_into("<Q", buf, counter, 2**64 - 2)
    producer = submission_producer(buf, LAYOUT)
    assert producer.push(entry(1))
    before = bytes(buf)
    with pytest.raises(ProtocolError, match="top of its counter"):
        producer.push(entry(2))
    assert bytes(buf) == before


def test_layout_is_page_aligned_and_checked_when_mapped() -> None:
    assert LAYOUT.window_offset % PAGE_BYTES == 0 and LAYOUT.arenas_offset % PAGE_BYTES == 0
    fd, mapping = create_shared(LAYOUT)
    assert map_shared(fd, LAYOUT).size() == LAYOUT.total_bytes
    with pytest.raises(ProtocolError, match="bytes"):
        map_shared(fd, RingLayout(8, LAYOUT.arena_bytes, LAYOUT.window_bytes))
    mapping[0:8] = b"XXXXXXXX"
    with pytest.raises(ProtocolError, match="header"):
        map_shared(fd, LAYOUT)


def vm_flags(mapping: mmap.mmap) -> list[str]:
    """The kernel's flags for ``mapping``, from /proc/self/smaps ("hg": MADV_HUGEPAGE)."""
    start = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
    lines = Path("/proc/self/smaps").read_text().splitlines()
    for i, line in enumerate(lines):
        if re.match(rf"{start:x}-[0-9a-f]+ ", line):
            return next(x for x in lines[i:] if x.startswith("VmFlags:")).split()[1:]
    raise AssertionError(f"no mapping at {start:#x} in /proc/self/smaps")


def test_both_sides_ask_for_the_session_memory_in_huge_pages() -> None:
    """Whether the kernel grants them is the host's setting (adp_gateway/host/hugepages.py); the
    advice is ours, on the gateway's mapping and on the plugin's (either may touch a page
    first, and that side's advice decides its size)."""
    fd, mapping = create_shared(LAYOUT)
    peer = map_shared(fd, LAYOUT)
    assert "hg" in vm_flags(mapping) and "hg" in vm_flags(peer)
    os.close(fd)


def test_a_peer_in_another_process_never_sees_a_half_written_counter() -> None:
    """The producer runs in a child process and publishes its tail 20,000 times while this
    process keeps reading it: a counter write the reader can catch half done (struct.pack_into
    zeroes before it writes) shows up as a ProtocolError here."""
    fd, mapping = create_shared(LAYOUT)
    buf = memoryview(mapping)
    pushes = 20_000
    pid = os.fork()
    if pid == 0:  # the producer
        code = 1
        try:
            producer = submission_producer(memoryview(map_shared(fd, LAYOUT)), LAYOUT)
            sent = 0
            while sent < pushes:
                sent += producer.push(entry(sent))
            code = 0
        finally:
            os._exit(code)
    consumer = submission_consumer(buf, LAYOUT)
    received: list[int] = []
    exit_status = None
    try:
        deadline = time.monotonic() + 300
        while len(received) < pushes and time.monotonic() < deadline:
            popped = consumer.pop_all()
            if not popped:
                os.sched_yield()
            received += [e.op_id for e in popped]
            if exit_status is None:
                reaped, status = os.waitpid(pid, os.WNOHANG)
                exit_status = status if reaped else None
    finally:
        if exit_status is None:
            if len(received) < pushes:
                os.kill(pid, signal.SIGKILL)
            exit_status = os.waitpid(pid, 0)[1]
        os.close(fd)
    assert received == list(range(pushes))
    assert os.waitstatus_to_exitcode(exit_status) == 0
