"""Lookups answered in the submit call, from the tenant's presence table (adp_wire/presence.py).

LMCache waits for EXISTS on every lookup. Through the ring the answer needs this plugin's I/O
thread and the gateway's session thread to run; from the presence table it needs neither, so a
lookup costs the same while the host is busy writing through as when it is idle. Keys the table
cannot answer (it is not complete and does not hold them) go through the ring as before.

The plugin counts what it answers in its session's shared memory (``LOOKUPS``), where the
gateway reads it for its metrics.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from adp_wire.presence import PresenceView


class LocalLookups:
    """One link's table and counters; thread-safe."""

    def __init__(self, view: PresenceView, counts: np.ndarray[Any, np.dtype[np.uint64]]) -> None:
        self._view = view
        self._counts = counts  # keys looked up, keys found: in the session's shared memory
        self._lock = threading.Lock()

    def find(self, keys: list[str]) -> list[bool] | None:
        """Each key's presence, or None when only the gateway can say."""
        found = self._view.find(keys)
        if found is not None:
            with self._lock:
                self._counts += np.array([len(found), sum(found)], np.uint64)
        return found
