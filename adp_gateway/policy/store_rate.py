"""How many bytes per second of stores arrive lately: a running rate over about ``window_s``
(an exponentially weighted sum), which pressure admission divides the card's capacity by to
know how long objects would last there were every store written (admission.py).

Not thread-safe: admission holds its own lock around it.
"""

from __future__ import annotations

import math


class StoreRate:
    def __init__(self, window_s: float) -> None:
        assert window_s > 0
        self._window_s = window_s
        self._rate = 0.0
        self._last_s: float | None = None

    def add(self, nbytes: int, now_s: float) -> None:
        if self._last_s is not None and now_s > self._last_s:
            self._rate *= math.exp(-(now_s - self._last_s) / self._window_s)
        self._last_s = now_s if self._last_s is None else max(self._last_s, now_s)
        self._rate += nbytes / self._window_s

    @property
    def bytes_per_s(self) -> float:
        return self._rate
