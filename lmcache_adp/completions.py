"""The completion queue LMCache drains: an eventfd plus a list of 4-tuples.

LMCache polls ``fd`` level-triggered and never reads it, so ``drain`` resets it before taking the
queue; a producer that pushes after the reset makes it readable again, so no wakeup is lost.
Every tuple is built here, so the shape LMCache requires is enforced in one place:
``(future_id: int, ok: bool, error: str, per_key: list[bool] | None)``.
"""

from __future__ import annotations

import os
import threading

from adp_wire.ring import doorbell

Completion = tuple[int, bool, str, list[bool] | None]


class CompletionQueue:
    def __init__(self) -> None:
        self.fd = doorbell.new()
        self._lock = threading.Lock()
        self._items: list[Completion] = []

    def push(self, future_id: int, ok: bool, error: str, per_key: list[bool]) -> None:
        item = (int(future_id), bool(ok), str(error), list(map(bool, per_key)))
        with self._lock:
            self._items.append(item)
            if self.fd >= 0:
                doorbell.ring(self.fd)

    def drain(self) -> list[Completion]:
        """Every completion queued so far; after ``close``, those reported while closing."""
        with self._lock:
            if self.fd >= 0:
                doorbell.answer(self.fd)
            items, self._items = self._items, []
        return items

    def close(self) -> None:
        with self._lock:
            fd, self.fd = self.fd, -1
        os.close(fd)
