"""A fault-injecting wrapper around any device, for tests: what storage does wrong.

- ``fail(op, errno, count)``: the next ``count`` reads or writes raise ``OSError(errno)`` (EIO, a
  full disk's ENOSPC...) without touching the device.
- ``tear_next_write(at)``: the next write lands only its first ``at`` bytes, then raises EIO, as a
  crash or a failing drive in the middle of a write leaves it.
- ``delay_s``: every read and write first sleeps this long (a latency spike or a stall).
- ``clear()``: no more failures or delays.
- ``power_loss(rng)``: what a power cut does to writes since the last ``sync``: each one, newest
  first, stays, is lost, or is torn at a 512-byte sector. Synced writes always stay. The device
  is then closed to further I/O, as the machine would be; reopen the inner device to go on.
"""

from __future__ import annotations

import errno as errno_codes
import mmap
import random
import threading
import time

from adp_gateway.card.software.devices.base import Device

SECTOR_BYTES = 512


class FaultyDevice:
    def __init__(self, inner: Device) -> None:
        self.inner = inner
        self.delay_s = 0.0
        self._lock = threading.Lock()
        self._failures: dict[str, list[int]] = {"read": [], "write": []}
        self._tear_at: int | None = None
        self._unsynced: list[tuple[int, bytes]] = []  # (offset, bytes before the write)
        self._dead = False

    @property
    def size_bytes(self) -> int:
        return self.inner.size_bytes

    def fail(self, op: str, errno: int = errno_codes.EIO, count: int = 1) -> None:
        with self._lock:
            self._failures[op].extend([errno] * count)

    def clear(self) -> None:
        with self._lock:
            self._failures = {"read": [], "write": []}
            self.delay_s = 0.0

    def tear_next_write(self, at: int) -> None:
        with self._lock:
            self._tear_at = at

    def write(self, buffers: list[memoryview], offset: int) -> None:
        """``buffers`` go to the inner device as they are (page aligned for O_DIRECT); a tear
        point should then be a multiple of 4 KiB too."""
        self._before("write")
        length = sum(len(b) for b in buffers)
        with self._lock:
            tear_at, self._tear_at = self._tear_at, None
            self._unsynced.append((offset, self._current(offset, length)))
        if tear_at is not None:
            if tear_at:
                self.inner.write(_prefix(buffers, tear_at), offset)
            raise OSError(errno_codes.EIO, "injected: torn write")
        self.inner.write(buffers, offset)

    def read(self, buffers: list[memoryview], offset: int) -> None:
        self._before("read")
        self.inner.read(buffers, offset)

    def sync(self) -> None:
        with self._lock:
            if self._dead:
                raise OSError(errno_codes.EIO, "injected: the device lost power")
            self._unsynced.clear()
        self.inner.sync()

    def close(self) -> None:
        self.inner.close()

    def power_loss(self, rng: random.Random) -> int:
        """Undo, lose or tear unsynced writes; returns how many were not kept whole."""
        with self._lock:
            self._dead = True
            pending, self._unsynced = self._unsynced, []
        damaged = 0
        for offset, before in reversed(pending):
            fate = rng.choice(("kept", "lost", "torn"))
            if fate == "kept":
                continue
            damaged += 1
            keep = 0 if fate == "lost" else rng.randrange(0, len(before), SECTOR_BYTES)
            restore = memoryview(mmap.mmap(-1, len(before) - keep))
            restore[:] = before[keep:]
            self.inner.write([restore], offset + keep)
        return damaged

    def _before(self, op: str) -> None:
        if self.delay_s:
            time.sleep(self.delay_s)
        with self._lock:
            if self._dead:
                raise OSError(errno_codes.EIO, "injected: the device lost power")
            if self._failures[op]:
                code = self._failures[op].pop(0)
                raise OSError(code, f"injected: {errno_codes.errorcode.get(code, code)}")

    def _current(self, offset: int, length: int) -> bytes:
        buf = memoryview(mmap.mmap(-1, length))
        self.inner.read([buf], offset)
        return bytes(buf)


def _prefix(buffers: list[memoryview], length: int) -> list[memoryview]:
    """The first ``length`` bytes of ``buffers``, as views of them."""
    out = []
    for buf in buffers:
        if length <= 0:
            break
        out.append(buf[:length])
        length -= len(buf)
    return out
