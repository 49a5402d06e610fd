"""Group commit: callers that need their writes durable share fdatasync calls.

A caller's writes are covered by any sync that *starts* after they completed. So a caller waits
for the sync in progress (which may not cover it), then either finds its writes covered by a
later one or starts that one itself. Under load, one fdatasync serves every thread that wrote
while the previous one ran, instead of one fdatasync per object.
"""

from __future__ import annotations

import threading

from gateway.backends.base import Device


class GroupSync:
    def __init__(self, device: Device) -> None:
        self._device = device
        self._cond = threading.Condition()
        self._completed_writes = 0
        self._synced_writes = 0  # every write counted up to here is durable
        self._syncing = False
        self.syncs = 0

    def wrote(self) -> None:
        """Count one completed write (call after the write returned)."""
        with self._cond:
            self._completed_writes += 1

    def sync(self) -> None:
        """Return once every write completed before this call is durable."""
        with self._cond:
            target = self._completed_writes
            while self._synced_writes < target:
                if self._syncing:
                    self._cond.wait()
                    continue
                self._syncing = True
                covering = self._completed_writes
                try:
                    self._cond.release()
                    try:
                        self._device.sync()
                    finally:
                        self._cond.acquire()
                    self._synced_writes = max(self._synced_writes, covering)
                    self.syncs += 1
                finally:
                    self._syncing = False
                    self._cond.notify_all()
