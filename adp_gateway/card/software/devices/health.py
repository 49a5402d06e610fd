"""How each database's device is doing: a wrapper around any device that counts its failed
reads, writes and syncs, for ``adp-gateway status`` and the metrics.

A device is ``ok`` with no failure in the last minute, else ``failing`` (with the last error).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from adp_gateway.card.software.devices.base import Device

RECENT_S = 60.0


class DeviceHealth:
    def __init__(self, inner: Device, database: int, path: str) -> None:
        self.inner = inner
        self.database = database
        self.path = path
        self.errors = 0
        self.last_error = ""
        self._recent: deque[float] = deque()  # monotonic times of errors in the last minute
        self._lock = threading.Lock()

    @property
    def size_bytes(self) -> int:
        return self.inner.size_bytes

    def write(self, buffers: list[memoryview], offset: int) -> None:
        self._watch(lambda: self.inner.write(buffers, offset), "write")

    def read(self, buffers: list[memoryview], offset: int) -> None:
        self._watch(lambda: self.inner.read(buffers, offset), "read")

    def sync(self) -> None:
        self._watch(self.inner.sync, "sync")

    def close(self) -> None:
        self.inner.close()

    def state(self) -> dict[str, object]:
        with self._lock:
            self._forget_old(time.monotonic())
            recent = len(self._recent)
            return {
                "database": self.database,
                "path": self.path,
                "health": "failing" if recent else "ok",
                "errors": self.errors,
                "errors_last_minute": recent,
                "last_error": self.last_error,
            }

    def _watch(self, call: Callable[[], None], what: str) -> None:
        try:
            call()
        except OSError as exc:
            now = time.monotonic()
            with self._lock:
                self.errors += 1
                self.last_error = f"{what}: {exc}"
                self._recent.append(now)
                self._forget_old(now)
            raise

    def _forget_old(self, now: float) -> None:
        while self._recent and self._recent[0] < now - RECENT_S:
            self._recent.popleft()
