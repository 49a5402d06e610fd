"""``sync: periodic``: a clock commits whatever was written every few milliseconds, so a
power cut loses at most the last interval's stores (configs/gateway.yaml states each policy).
It runs the card's ``syncs`` (one per database on the software card), each on a thread of its
own: a device whose fdatasync does not return holds back only its own. It knows nothing of
devices."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from adp_wire.threads import NamedThread

log = logging.getLogger(__name__)


class PeriodicSync:
    """Group commit on a clock: each of ``syncs`` runs every ``interval_s`` in a thread of its
    own, so stores are acknowledged without waiting and durable at most one interval later."""

    def __init__(self, syncs: Sequence[Callable[[], None]], interval_s: float) -> None:
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._threads = [
            NamedThread(target=self._run, args=(sync,), name=f"sync-{i}", daemon=True)
            for i, sync in enumerate(syncs)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self, timeout_s: float | None = None) -> list[str]:
        """Stop the clocks; the names of the threads still in a sync after ``timeout_s`` in all
        (``sync-D``: database D does not answer; the caller goes on without them)."""
        self._stop.set()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for thread in self._threads:
            if thread.ident is not None:  # started
                thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return [thread.name for thread in self._threads if thread.is_alive()]

    def _run(self, sync: Callable[[], None]) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                sync()
            except Exception:  # a failed sync is retried at the next tick, never fatal
                log.exception("periodic sync failed")
