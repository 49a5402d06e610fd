"""Single-producer single-consumer queues of fixed-size entries in shared memory.

Each side keeps its own index privately and only publishes it; it never trusts the copy in shared
memory, which the peer could overwrite. The peer's index is read and checked on every use: a
consumer seeing more than ``capacity`` entries, or a producer seeing the consumer ahead of it,
raises ``ProtocolError``.

Ordering: an entry is written before the tail that publishes it, and read after the tail. Each
counter is one aligned 8-byte store; x86-64's total store order keeps these in order. Counters go
through a memoryview cast to unsigned 64-bit words, which moves all 8 bytes at once:
``struct.pack_into`` is not usable for them, because it zeroes its target before writing it and
the peer can read that zero in between. On a weakly ordered CPU (aarch64, as on Grace-Hopper)
the peer could see a tail before the entry it publishes, and Python has no release or acquire
store to stop that, so both sides refuse to run there (``check_host``; docs/design.md, "Ring").

Counters start at 0 (a new memfd is zeros) and never wrap: 2**64 entries at a billion a second
take 584 years, and wrapping modulo 2**64 would move the slot an index maps to unless the slot
count is a power of two. A producer's counter can only reach 2**64 - 1 if the peer wrote it
there before the queue was made; its next push raises ``ProtocolError`` and writes nothing.
"""

from __future__ import annotations

import platform
import struct
from typing import Any, Generic, TypeVar

from adp_wire.errors import ProtocolError, UnsupportedHost
from adp_wire.ring.layout import (
    COMPLETION,
    CQ_HEAD,
    CQ_TAIL,
    SQ_HEAD,
    SQ_TAIL,
    SUBMISSION,
    Completion,
    RingLayout,
    Submission,
)

E = TypeVar("E", Submission, Completion)
COUNTER_MAX = 2**64 - 1
TOTAL_STORE_ORDER = ("x86_64", "amd64", "i686", "i386")  # platform.machine() of TSO CPUs


def check_host(machine: str | None = None) -> None:
    """Raise UnsupportedHost unless this CPU keeps stores in order (see the module docstring)."""
    machine = platform.machine() if machine is None else machine
    if machine.lower() not in TOTAL_STORE_ORDER:
        raise UnsupportedHost(
            f"this host's CPU ({machine}) may reorder stores to shared memory, and lmcache-adp's "
            "rings are written for x86-64's total store order: run the gateway and LMCache on "
            "an x86-64 host"
        )


class _Queue(Generic[E]):
    def __init__(
        self,
        buf: memoryview,
        entries_offset: int,
        entry: struct.Struct,
        make: Any,
        capacity: int,
        own_offset: int,
        peer_offset: int,
    ) -> None:
        self._buf = buf
        self._words = buf.cast("Q")  # the mapping's length is a multiple of 4 KiB
        self._entries_offset = entries_offset
        self._entry = entry
        self._make = make
        self.capacity = capacity
        self._own_offset = own_offset
        self._peer_offset = peer_offset
        self._index = self._read(own_offset)  # our own counter: from here on, ours alone

    def _read(self, offset: int) -> int:
        return int(self._words[offset // 8])

    def _publish(self) -> None:
        self._words[self._own_offset // 8] = self._index

    def _slot_offset(self, index: int) -> int:
        return self._entries_offset + (index % self.capacity) * self._entry.size


class Producer(_Queue[E]):
    def push(self, entry: E) -> bool:
        """Append one entry; False when the queue is full (the consumer is behind)."""
        if self._index == COUNTER_MAX:
            raise ProtocolError(f"peer set the queue tail to {self._index}, the top of its counter")
        head = self._read(self._peer_offset)
        used = self._index - head
        if not 0 <= used <= self.capacity:
            raise ProtocolError(f"peer moved the queue head to {head}, tail is {self._index}")
        if used == self.capacity:
            return False
        self._entry.pack_into(self._buf, self._slot_offset(self._index), *entry)
        self._index += 1
        self._publish()
        return True


class Consumer(_Queue[E]):
    def pop_all(self) -> list[E]:
        """Take every published entry, in order."""
        tail = self._read(self._peer_offset)
        available = tail - self._index
        if not 0 <= available <= self.capacity:
            raise ProtocolError(f"peer moved the queue tail to {tail}, head is {self._index}")
        out = [
            self._make(*self._entry.unpack_from(self._buf, self._slot_offset(index)))
            for index in range(self._index, tail)
        ]
        self._index = tail
        self._publish()
        return out


def submission_producer(buf: memoryview, layout: RingLayout) -> Producer[Submission]:
    return Producer(buf, layout.sq_offset, SUBMISSION, Submission, layout.slots, SQ_TAIL, SQ_HEAD)


def submission_consumer(buf: memoryview, layout: RingLayout) -> Consumer[Submission]:
    return Consumer(buf, layout.sq_offset, SUBMISSION, Submission, layout.slots, SQ_HEAD, SQ_TAIL)


def completion_producer(buf: memoryview, layout: RingLayout) -> Producer[Completion]:
    return Producer(buf, layout.cq_offset, COMPLETION, Completion, layout.slots, CQ_TAIL, CQ_HEAD)


def completion_consumer(buf: memoryview, layout: RingLayout) -> Consumer[Completion]:
    return Consumer(buf, layout.cq_offset, COMPLETION, Completion, layout.slots, CQ_HEAD, CQ_TAIL)
