"""Page-aligned buffers (O_DIRECT's rule) and a read-ahead window over one region of a device,
for the reads that do not trust what they read: recovery, sealing and ``adp-gateway check``."""

from __future__ import annotations

import mmap

from adp_gateway.card.software.devices.base import Device
from adp_wire.ring.layout import PAGE_BYTES, align_up

READ_AHEAD_BYTES = 2**20


def aligned(size: int) -> memoryview:
    """A page-aligned, zeroed buffer (anonymous mmap), as O_DIRECT requires."""
    return memoryview(mmap.mmap(-1, size))


class RegionReader:
    """Pages of one region, read through a window that moves forward. With ``zero_unreadable``
    a page the device fails to read (a bad sector) reads as zeros, which no record verifies,
    and is listed in ``unreadable``: recovery then loses the records in it, not the region's
    others."""

    def __init__(
        self, device: Device, start: int, region_bytes: int, zero_unreadable: bool = False
    ) -> None:
        self.device = device
        self.start = start
        self.region_bytes = region_bytes
        self.zero_unreadable = zero_unreadable
        self.unreadable: list[int] = []  # offsets from the region's start of pages read as zeros
        self._buffer = aligned(READ_AHEAD_BYTES)
        self._at = 0
        self._length = 0

    def page(self, offset: int, read_ahead: bool = True) -> memoryview:
        """The 4 KiB page at ``offset`` from the region's start."""
        return self.span(offset, PAGE_BYTES, read_ahead)

    def span(self, offset: int, length: int, read_ahead: bool = True) -> memoryview:
        """``length`` bytes at ``offset`` (page aligned) from the region's start, valid until
        the next call: from the window when it holds them, else read with the window moved
        there (and grown, for a span larger than the read-ahead)."""
        end = offset + length
        if not (self._at <= offset and end <= self._at + self._length):
            ahead = max(READ_AHEAD_BYTES if read_ahead else PAGE_BYTES, align_up(length))
            self._length = min(ahead, self.region_bytes - offset)
            if self._length > len(self._buffer):
                self._buffer = aligned(self._length)
            self._at = offset
            self._fill(self._buffer[: self._length], offset)
        return self._buffer[offset - self._at : end - self._at]

    def read(self, offset: int, length: int) -> memoryview:
        buf = aligned(align_up(length))
        self._fill(buf, offset)
        return buf[:length]

    def _fill(self, buf: memoryview, offset: int) -> None:
        try:
            self.device.read([buf], self.start + offset)
        except OSError:
            if not self.zero_unreadable:
                raise
            for at in range(0, len(buf), PAGE_BYTES):  # again, page by page
                page = buf[at : at + PAGE_BYTES]
                try:
                    self.device.read([page], self.start + offset + at)
                except OSError:
                    page[:] = bytes(len(page))
                    if offset + at not in self.unreadable:
                        self.unreadable.append(offset + at)
