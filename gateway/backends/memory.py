"""A device in memory, for unit tests of the region log and store."""

from __future__ import annotations


class MemoryDevice:
    def __init__(self, size_bytes: int) -> None:
        self._data = bytearray(size_bytes)
        self.syncs = 0

    @property
    def size_bytes(self) -> int:
        return len(self._data)

    def write(self, buffers: list[memoryview], offset: int) -> None:
        for buf in buffers:
            self._data[offset : offset + len(buf)] = buf
            offset += len(buf)

    def read(self, buffers: list[memoryview], offset: int) -> None:
        for buf in buffers:
            buf[:] = self._data[offset : offset + len(buf)]
            offset += len(buf)

    def sync(self) -> None:
        self.syncs += 1

    def close(self) -> None:
        pass

    def corrupt(self, offset: int) -> None:
        """Flip one byte, as a bad sector would (tests only)."""
        self._data[offset] ^= 0xFF
