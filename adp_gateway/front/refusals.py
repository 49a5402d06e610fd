"""The gateway's log of refused connections: every refusal leaves a trace, and no flood fills
the log.

Refusals are folded per peer uid and kind of reason (a wrong token, an undeclared tenant,
busy handshake slots, a timeout, garbage...). The first refusal of a uid and kind is logged at
once, with its reason and peer, and opens a window of ``interval_s``; the same uid and kind
in that window are counted, not logged, and when the window ends (the gateway's housekeeping
calls ``flush_due``, or its stop calls ``flush``) one line says how many were folded and the
last reason. So a wrong-token attempt is logged even right after a harmless probe from the
same uid, and a flood of one kind costs two lines per ``interval_s``.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from adp_gateway.front.tenants import Peer

# (uid, kind) windows kept at once; past it, refusals of new pairs fold into one shared window,
# so a peer cycling through reasons cannot grow the gateway's memory.
WINDOWS_MAX = 1024
_OVERFLOW = (-1, "other")


@dataclass
class _Window:
    ends: float  # monotonic
    folded: int = 0
    last: str = ""  # the last folded refusal's peer and reason


class RefusalLog:
    def __init__(self, logger: logging.Logger, interval_s: float = 10.0) -> None:
        self._logger = logger
        self._interval_s = interval_s
        self._windows: dict[tuple[int, str], _Window] = {}
        self._lock = threading.Lock()

    def refused(self, peer: Peer, kind: str, why: str) -> None:
        """Log (or count) one refusal of ``peer`` for ``why``; ``kind`` names its reason
        without the details that vary from one attempt to the next."""
        line = f"refused client {peer}: {why}"
        now = time.monotonic()
        with self._lock:
            self._flush_due(now)
            key = (peer.uid, kind)
            if key not in self._windows and len(self._windows) >= WINDOWS_MAX:
                key = _OVERFLOW
            window = self._windows.get(key)
            if window is not None:
                window.folded += 1
                window.last = line
                return
            self._windows[key] = _Window(now + self._interval_s)
        self._logger.warning("%s", line)

    def flush_due(self) -> None:
        """Log the folded counts of the windows that have ended (housekeeping, often)."""
        with self._lock:
            self._flush_due(time.monotonic())

    def flush(self) -> None:
        """Log every folded count now (at stop)."""
        with self._lock:
            self._flush_due(float("inf"))

    def _flush_due(self, now: float) -> None:
        for key, window in list(self._windows.items()):
            if window.ends > now:
                continue
            del self._windows[key]
            if window.folded:
                who = "of other peers" if key == _OVERFLOW else f"like it of uid {key[0]}"
                self._logger.warning(
                    "%s (and %d more refusals %s in the last %g s)",
                    window.last,
                    window.folded - 1,
                    who,
                    self._interval_s,
                )
