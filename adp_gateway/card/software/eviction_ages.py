"""How long the card keeps what it holds, as its evictions tell: the card reports each region
it reclaims and how long that region had gone unread, and admission asks whether the card is
evicting and, if so, how long an object lately lasted in it (``eviction_age_s``).

The card calls ``evicted`` under its own lock; admission reads ``eviction_age_s`` from another
thread. Both touch two floats, each read or written whole.
"""

from __future__ import annotations

SMOOTHING = 1 / 16  # each eviction's weight in the running age


class EvictionAges:
    def __init__(self) -> None:
        self._age_s: float | None = None
        self._last_s = 0.0

    def evicted(self, age_s: float, now_s: float) -> None:
        """A region was reclaimed ``age_s`` seconds after it was last written or read."""
        age_s = max(0.0, age_s)
        previous = self._age_s
        self._age_s = age_s if previous is None else previous + SMOOTHING * (age_s - previous)
        self._last_s = now_s

    def eviction_age_s(self, now_s: float) -> float | None:
        """How long objects lately lasted before eviction; None while the card is not evicting
        (it never has, or not for longer than objects lasted in it: it has room again)."""
        age_s = self._age_s
        if age_s is None or now_s - self._last_s > max(age_s, 1.0):
            return None
        return age_s
