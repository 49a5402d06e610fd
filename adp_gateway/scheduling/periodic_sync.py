"""``sync: periodic``: a clock commits whatever was written every few milliseconds, so a
power cut loses at most the last interval's stores (configs/gateway.yaml states each policy).
It calls the card's ``sync_all``; it knows nothing of devices."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from adp_wire.threads import NamedThread

log = logging.getLogger(__name__)


class PeriodicSync:
    """Group commit on a clock: ``sync`` runs every ``interval_s`` in a thread of its own, so
    stores are acknowledged without waiting and durable at most one interval later."""

    def __init__(self, sync: Callable[[], None], interval_s: float) -> None:
        self._sync = sync
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = NamedThread(target=self._run, name="periodic-sync", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float | None = None) -> bool:
        """Stop the clock; False when its thread is still in a sync after ``timeout_s`` (a
        disk that does not answer: the caller goes on without it)."""
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self._sync()
            except Exception:  # a failed sync is retried at the next tick, never fatal
                log.exception("periodic sync failed")
