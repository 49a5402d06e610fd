"""Which region to evict: the software card reclaims whole regions, and this keeps them ranked.

Two rankings (the config's ``eviction``):

- ``lru``: the region least recently written or read;
- ``scan-resistant`` (the default): LRU, where a region never read since its filling began ages
  ``UNREAD_AGE_FACTOR`` times as fast as one that was read. A region of objects written once
  and never asked for again (most of them, on production traffic: 74 % of a chat service's
  blocks were never read again) goes before an older one whose objects were read, yet a new
  region gets time to be read at all, in proportion to how long the cache keeps anything.

Either way a region that holds nothing the store still uses (its objects deleted or replaced)
goes first; eviction.py keeps those apart. On the project's production trace, behind the
gateway's admission, the scan-resistant ranking hit up to 0.74 points of the references more
than LRU at 1 to 25 % of the distinct blocks, and 0.09 less at 50 %
(bench/results/trace-sim-vm.md: ``ours`` against ``ours-lru``).

An ``EvictionOrder`` holds one pool's filled regions of one database in two sorted lists (by
last use, and the unread ones by last use), so that finding the victim costs O(log n) whatever
the drive's size: a pass over 120,000 regions (a 7.68 TB drive in 64 MiB regions) cost 50 ms at
each take. Clocks are logical (a counter of fillings and reads). A region never read has been
used last when its filling began; within each list the order does not change as the clock
advances, so only the two lists' heads compete.

``bench/trace_sim.py`` ranks its simulated regions with this same class.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from itertools import islice
from typing import Protocol

from sortedcontainers import SortedList

# Weighed on the production trace (bench/results/trace-bounds-vm.md: 1 to 4 at each capacity):
# 1.6 hits the most at 1 and 2 % of its distinct blocks; 2.5 at 10 % (0.4 points of the
# references more, and 0.23 and 0.08 fewer at 1 and 2 %); any faster aging than LRU's costs 0.09
# to 0.10 points at 50 %.
UNREAD_AGE_FACTOR = 1.6


class Ranking(StrEnum):
    LRU = "lru"
    SCAN_RESISTANT = "scan-resistant"


class Ranked(Protocol):
    """What the ranking reads of a region; ``reads`` counts reads since its filling began."""

    @property
    def index(self) -> int: ...
    @property
    def last_access(self) -> int: ...
    @property
    def reads(self) -> int: ...


# Orders victims across pools, lowest first: minus how long ago, on the clock, a region counts
# as last used (an age, not a clock: after a restart clocks run near 2**60, see recovery.py,
# where a float keeps no single ticks).
Rank = float


class EvictionOrder:
    """The filled regions of one pool of one database, ranked. A region is ``add``-ed once
    filled and ``remove``-d before any of the fields the ranking reads changes, so each list
    finds its entry by the values it was added with."""

    def __init__(self, unread_age_factor: float = UNREAD_AGE_FACTOR) -> None:
        # The card passes UNREAD_AGE_FACTOR; other values are for bench/trace_bounds.py's grid.
        self._unread_age_factor = unread_age_factor
        self._by_use: SortedList[tuple[int, int]] = SortedList()  # (last_access, index)
        self._unread: SortedList[tuple[int, int]] = SortedList()  # the same, reads == 0

    def __len__(self) -> int:
        return len(self._by_use)

    def add(self, region: Ranked) -> None:
        self._by_use.add((region.last_access, region.index))
        if region.reads == 0:
            self._unread.add((region.last_access, region.index))

    def remove(self, region: Ranked) -> None:
        self._by_use.remove((region.last_access, region.index))
        if region.reads == 0:
            self._unread.remove((region.last_access, region.index))

    def least_recently_used(self, count: int) -> list[int]:
        """The indices of the ``count`` regions used least recently, least first."""
        return [index for _, index in islice(self._by_use, count)]

    def victim(
        self, ranking: Ranking, may_take: Callable[[int], bool], now: int
    ) -> tuple[Rank, int] | None:
        """The region to evict first among those ``may_take`` (by index) allows, at clock
        ``now``, with its rank; None if it allows none."""
        used = _first(self._by_use, may_take)
        age = None if used is None else float(now - used[0])
        if ranking == Ranking.SCAN_RESISTANT:
            unread = _first(self._unread, may_take)
            if unread is not None:
                aged = self._unread_age_factor * (now - unread[0])
                if age is None or aged >= age:
                    return -aged, unread[1]
        return None if used is None or age is None else (-age, used[1])


def _first(
    ranked: SortedList[tuple[int, int]], may_take: Callable[[int], bool]
) -> tuple[int, int] | None:
    return next(((clock, index) for clock, index in ranked if may_take(index)), None)
