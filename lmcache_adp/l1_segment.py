"""Finding LMCache's L1 in shared memory, for the zero-copy path (plugin side).

``lmcache server --shm-name NAME`` keeps L1 in ``/dev/shm/lmcache_l1_pool_NAME``, mapped shared
into the server (and into this plugin, which runs inside it) before any L2 adapter is made. The
plugin finds that mapping in ``/proc/self/maps``, sends the file's fd to the gateway with its
hello, and from then on a buffer inside the mapping travels as an offset into the segment.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

import numpy as np

from adp_wire.ring.layout import PAGE_BYTES
from lmcache_adp.logs import log

SEGMENT_PREFIX = "/dev/shm/lmcache_l1_pool_"


@dataclass(frozen=True)
class L1Map:
    path: str
    start: int  # address of the segment's first byte in this process
    size: int

    def offset_of(self, buffer: memoryview) -> int | None:
        """The segment offset of ``buffer``, if it lies wholly inside the segment and starts
        on a page (what O_DIRECT needs); None otherwise (the copy path)."""
        if not buffer.nbytes:
            return None
        offset = address_of(buffer) - self.start
        if offset % PAGE_BYTES or offset < 0 or offset + buffer.nbytes > self.size:
            return None
        return offset

    def open(self) -> int:
        """A new read-only fd of the segment, to hand to the gateway: it only ever reads L1."""
        return os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)


def address_of(buffer: memoryview) -> int:
    """Where ``buffer`` starts in this process. ctypes takes a third of numpy's time (``.ctypes``
    builds an object per call), and this runs on each store's post."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(buffer))
    except TypeError:  # read-only: ctypes will not take it
        return int(np.frombuffer(buffer, np.uint8).ctypes.data)


def find(maps_path: str = "/proc/self/maps") -> L1Map | None:
    """LMCache's L1 segment as this process maps it, or None when L1 is private memory.

    Only a segment mapped whole, shared and writable, from offset 0, qualifies."""
    found: list[L1Map] = []
    with open(maps_path) as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) < 6 or not fields[5].startswith(SEGMENT_PREFIX):
                continue
            span, perms, file_offset, path = fields[0], fields[1], fields[2], fields[5].rstrip()
            start, end = (int(x, 16) for x in span.split("-"))
            if perms.startswith("rw") and perms[3] == "s" and int(file_offset, 16) == 0:
                found.append(L1Map(path, start, end - start))
    whole = [m for m in found if _file_bytes(m.path) == m.size]
    if len(whole) != 1:
        if found:
            log.info("no single whole L1 segment mapped (%s); using the copy path", found)
        return None
    return whole[0]


def _file_bytes(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1
