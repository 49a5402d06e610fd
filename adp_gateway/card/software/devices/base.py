"""The device seam: positional vectored I/O on one database's space.

Contract: ``write``/``read`` move whole buffers at ``offset``; buffers are page aligned and their
lengths are multiples of 4 KiB (O_DIRECT's rules). They are thread-safe and may run concurrently
on disjoint ranges. Short transfers are retried inside; an error raises ``OSError``.
"""

from __future__ import annotations

from typing import Protocol


class Device(Protocol):
    @property
    def size_bytes(self) -> int: ...

    def write(self, buffers: list[memoryview], offset: int) -> None: ...

    def read(self, buffers: list[memoryview], offset: int) -> None: ...

    def sync(self) -> None: ...

    def close(self) -> None: ...
