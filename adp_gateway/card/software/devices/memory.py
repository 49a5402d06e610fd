"""A device in memory, for unit tests of the region log and store."""

from __future__ import annotations

import errno


class MemoryDevice:
    def __init__(self, size_bytes: int) -> None:
        self._data = bytearray(size_bytes)
        self.syncs = 0

    @property
    def size_bytes(self) -> int:
        return len(self._data)

    def write(self, buffers: list[memoryview], offset: int) -> None:
        self._check(buffers, offset)
        for buf in buffers:
            self._data[offset : offset + len(buf)] = buf
            offset += len(buf)

    def read(self, buffers: list[memoryview], offset: int) -> None:
        self._check(buffers, offset)
        for buf in buffers:
            buf[:] = self._data[offset : offset + len(buf)]
            offset += len(buf)

    def _check(self, buffers: list[memoryview], offset: int) -> None:
        """I/O outside the device fails with OSError, as it does on a file or block device."""
        end = offset + sum(len(buf) for buf in buffers)
        if offset < 0 or end > len(self._data):
            raise OSError(errno.EIO, f"bytes {offset}..{end} are outside the device")

    def sync(self) -> None:
        self.syncs += 1

    def close(self) -> None:
        pass

    def corrupt(self, offset: int) -> None:
        """Flip one byte, as a bad sector would (tests only)."""
        self._data[offset] ^= 0xFF
