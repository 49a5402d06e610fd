"""First-fit allocation of 4 KiB-aligned extents in the transfer window (plugin side only)."""

from __future__ import annotations

from adp_wire.ring.layout import PAGE_BYTES, align_up


class WindowAllocator:
    def __init__(self, window_bytes: int) -> None:
        self.window_bytes = window_bytes
        self._free: list[tuple[int, int]] = [(0, window_bytes)]  # (offset, length), sorted

    def allocate(self, nbytes: int) -> int | None:
        """The offset of a free extent of ``nbytes`` (rounded up to 4 KiB), or None when full."""
        size = align_up(max(nbytes, 1), PAGE_BYTES)
        for i, (offset, length) in enumerate(self._free):
            if length >= size:
                if length == size:
                    del self._free[i]
                else:
                    self._free[i] = (offset + size, length - size)
                return offset
        return None

    def release(self, offset: int, nbytes: int) -> None:
        size = align_up(max(nbytes, 1), PAGE_BYTES)
        self._free.append((offset, size))
        self._free.sort()
        merged: list[tuple[int, int]] = []
        for start, length in self._free:
            if merged and merged[-1][0] + merged[-1][1] == start:
                merged[-1] = (merged[-1][0], merged[-1][1] + length)
            else:
                merged.append((start, length))
        self._free = merged

    @property
    def free_bytes(self) -> int:
        return sum(length for _, length in self._free)
