"""Group commit: callers that need their writes durable share fdatasync calls (``sync:
always``), or a clock commits whatever was written every few milliseconds (``sync: periodic``).

A caller's writes are covered by any sync that *starts* after they completed. So a caller waits
for the sync in progress (which may not cover it), then either finds its writes covered by a
later one or starts that one itself. Under load, one fdatasync serves every thread that wrote
while the previous one ran, instead of one fdatasync per object.
"""

from __future__ import annotations

import logging
import threading
import time

from adp_gateway.card.software.devices.base import Device

log = logging.getLogger(__name__)
SYNC_WAIT_S = 10.0  # for a sync another thread runs; the op's client has given up by then


class GroupSync:
    def __init__(self, device: Device) -> None:
        self._device = device
        self._cond = threading.Condition()
        self._completed_writes = 0
        self._synced_writes = 0  # every write counted up to here is durable
        self._syncing = False
        self.syncs = 0

    def wrote(self) -> int:
        """Count one completed write (call after the write returned); returns its ticket."""
        with self._cond:
            self._completed_writes += 1
            return self._completed_writes

    def covers(self, ticket: int) -> bool:
        """Whether the write of ``ticket`` is durable (a sync that started after it ended)."""
        with self._cond:
            return self._synced_writes >= ticket

    def sync(self) -> None:
        """Return once every write completed before this call is durable. Raises TimeoutError
        (an OSError) when another caller's sync, which this one waits for, has not returned
        within SYNC_WAIT_S: a disk that does not answer fails the ops that need it."""
        deadline = time.monotonic() + SYNC_WAIT_S
        with self._cond:
            target = self._completed_writes
            while self._synced_writes < target:
                if self._syncing:
                    if not self._cond.wait(deadline - time.monotonic()):
                        raise TimeoutError(f"a sync has not returned in {SYNC_WAIT_S:g} s")
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
