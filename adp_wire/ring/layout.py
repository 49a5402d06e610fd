"""Layout of one session's shared memory (a memfd created by the gateway).

::

    0        header: magic, version, geometry; queue counters on their own cache lines; the
             plugin's counts of the keys it looked up in the presence table and found there,
             and of the stores LMCache handed it that the tier did not take
    4096     submission queue: ``slots`` x 64-byte Submission entries (plugin -> gateway)
    ...      completion queue: ``slots`` x 32-byte Completion entries (gateway -> plugin)
    ...      arenas: ``slots`` x ``arena_bytes``, one per slot: request keys in, per-key results out
    ...      transfer window: ``window_bytes``, 4 KiB aligned; object bytes in 4 KiB-aligned extents

A slot is owned by one op from submit to completion, so neither queue can hold more than
``slots`` entries. Every counter and field a peer writes is validated by the reader.

Both sides ask for the memory in huge pages (``MADV_HUGEPAGE``): the gateway's O_DIRECT reads and
writes go straight to and from the window, and a request to the disk can only span pages that
lie side by side in physical memory; a long-running host's 4 KiB pages rarely do, which cuts each
request to ``max_segments`` pages (512 KiB on a virtio disk) where 2 MiB pages let it reach the
device's largest. The kernel grants them when
``/sys/kernel/mm/transparent_hugepage/shmem_enabled`` is ``advise`` (or ``within_size``,
``always``); otherwise the advice does nothing (docs/operations.md).

Zero-copy stores (``FLAG_L1``) are written to the disk straight from the client's own L1 segment
instead of the window. The gateway only ever reads L1, and only whole pages of objects that are
whole pages long; every load lands in the window (docs/design.md, "Zero-copy stores").
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
from dataclasses import dataclass
from typing import NamedTuple

from adp_wire.errors import ProtocolError
from adp_wire.sealed import check_sealed, sealed_memfd

PAGE_BYTES = 4096
MAGIC = b"ADPRING1"
LAYOUT_VERSION = 5
_HEADER = struct.Struct("<8sIIIIQ")  # magic, version, slots, arena_bytes, reserved, window_bytes
SQ_HEAD, SQ_TAIL, CQ_HEAD, CQ_TAIL = 64, 128, 192, 256  # one counter per cache line
LOOKUPS = 320  # u64 keys looked up, u64 found: lookups the plugin answered itself (its counts)
UNTAKEN = 336  # u64 stores, u64 bytes: LMCache's stores reported not stored (the plugin's counts)

SUBMISSION = struct.Struct("<QBBHIIIQQQ16x")
COMPLETION = struct.Struct("<QIBBHIIQ")
FLAG_L1 = 1  # Submission.flags, SET only: data_offset is an offset into the client's L1 segment
FLAG_REMOTE = 2  # SET only: the gateway copies the object into the window from the client's memory


class Submission(NamedTuple):
    op_id: int
    op: int
    flags: int
    reserved: int
    slot: int
    request_bytes: int
    reserved2: int
    deadline_ns: int  # CLOCK_MONOTONIC, shared by all processes of the host
    data_offset: int  # into the window (FLAG_REMOTE: where the gateway copies it), or into L1
    data_bytes: int  # the object's logical length


class Completion(NamedTuple):
    op_id: int
    slot: int
    status: int
    reserved: int
    reserved2: int
    result_bytes: int  # bytes of per-key results in the slot's arena
    reserved3: int
    data_bytes: int  # GET: the stored object's length


def align_up(value: int, alignment: int = PAGE_BYTES) -> int:
    return (value + alignment - 1) // alignment * alignment


@dataclass(frozen=True)
class RingLayout:
    slots: int
    arena_bytes: int
    window_bytes: int

    @property
    def sq_offset(self) -> int:
        return PAGE_BYTES

    @property
    def cq_offset(self) -> int:
        return self.sq_offset + self.slots * SUBMISSION.size

    @property
    def arenas_offset(self) -> int:
        return align_up(self.cq_offset + self.slots * COMPLETION.size)

    @property
    def window_offset(self) -> int:
        return align_up(self.arenas_offset + self.slots * self.arena_bytes)

    @property
    def total_bytes(self) -> int:
        return self.window_offset + self.window_bytes

    def arena(self, buf: memoryview, slot: int) -> memoryview:
        start = self.arenas_offset + slot * self.arena_bytes
        return buf[start : start + self.arena_bytes]

    def window(self, buf: memoryview) -> memoryview:
        return buf[self.window_offset : self.total_bytes]


def create_shared(layout: RingLayout) -> tuple[int, mmap.mmap]:
    """Create the memfd for a new session, write its header and map it (gateway side)."""
    fd = sealed_memfd("adp-session", layout.total_bytes)
    mapping = mmap.mmap(fd, layout.total_bytes)
    prefer_huge_pages(mapping)
    _HEADER.pack_into(
        mapping, 0, MAGIC, LAYOUT_VERSION, layout.slots, layout.arena_bytes, 0, layout.window_bytes
    )
    return fd, mapping


def prefer_huge_pages(mapping: mmap.mmap) -> None:
    """Advise the kernel to back ``mapping`` with huge pages (see the module's docstring); a
    kernel without transparent huge pages refuses the advice, which changes nothing."""
    with contextlib.suppress(OSError):
        mapping.madvise(mmap.MADV_HUGEPAGE)


def map_shared(fd: int, layout: RingLayout) -> mmap.mmap:
    """Map a session memfd received from the gateway and check it matches the welcome."""
    check_sealed(fd, "the session memory")
    size = os.fstat(fd).st_size
    if size != layout.total_bytes:
        raise ProtocolError(
            f"session memory is {size} bytes, the welcome promised {layout.total_bytes}"
        )
    mapping = mmap.mmap(fd, size)
    prefer_huge_pages(mapping)  # whichever side touches a page first decides its size
    magic, version, slots, arena, _, window = _HEADER.unpack_from(mapping, 0)
    if (magic, version, slots, arena, window) != (
        MAGIC,
        LAYOUT_VERSION,
        layout.slots,
        layout.arena_bytes,
        layout.window_bytes,
    ):
        mapping.close()
        raise ProtocolError("session memory header does not match the welcome")
    return mapping
