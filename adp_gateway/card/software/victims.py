"""Which region to evict: the software card reclaims whole regions, and this keeps them ranked.

Two rankings (the config's ``eviction``):

- ``lru``: the region least recently written or read;
- ``scan-resistant`` (the default): among the oldest ``UNREAD_OLDEST_SHARE`` of the regions, by
  when their filling began, those never read since go first, oldest first; then the rest in
  LRU order. A region of objects written once and never asked for again (most of them, on
  production traffic: 74 % of a chat service's blocks were never read again) goes before an
  older one whose objects were read, yet every region gets the newest part of the cache's life
  to be read at all.

Either way a region that holds nothing the store still uses (its objects deleted or replaced)
goes first; eviction.py keeps those apart. On the project's production trace, behind the
gateway's admission, the scan-resistant ranking hit up to 0.3 % of the references more than LRU
at 5 to 25 % of the distinct blocks, and up to 0.1 % less at 1, 2 and 50 %
(bench/results/trace-sim-vm.md).

An ``EvictionOrder`` holds one pool's filled regions of one database in three sorted lists (by
last use, by filling, the unread ones by filling), so that finding the victim costs O(log n)
whatever the drive's size: a pass over 120,000 regions (a 7.68 TB drive in 64 MiB regions) cost
50 ms at each take, and ranking a sample of 2,048 of them cost 5 ms and missed the best victim.
Clocks are logical (a counter of fillings and reads). A region that was never read has been
used last when its filling began (its ``last_access`` is its ``filled_at``), so the unread ones
in filling order are also in LRU order.

``bench/trace_sim.py`` ranks its simulated regions with this same class.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from enum import StrEnum
from itertools import islice
from typing import Protocol

from sortedcontainers import SortedList

UNREAD_OLDEST_SHARE = 0.2


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
    def filled_at(self) -> int: ...
    @property
    def reads(self) -> int: ...


# Orders victims across pools: an unread old region (0) before any other (1), then its clock.
Rank = tuple[int, int]


class EvictionOrder:
    """The filled regions of one pool of one database, ranked. A region is ``add``-ed once
    filled and ``remove``-d before any of the fields the ranking reads changes, so each list
    finds its entry by the values it was added with."""

    def __init__(self) -> None:
        self._by_use: SortedList[tuple[int, int]] = SortedList()  # (last_access, index)
        self._by_filling: SortedList[tuple[int, int]] = SortedList()  # (filled_at, index)
        self._unread: SortedList[tuple[int, int]] = SortedList()  # (filled_at, index)

    def __len__(self) -> int:
        return len(self._by_use)

    def add(self, region: Ranked) -> None:
        self._by_use.add((region.last_access, region.index))
        self._by_filling.add((region.filled_at, region.index))
        if region.reads == 0:
            self._unread.add((region.filled_at, region.index))

    def remove(self, region: Ranked) -> None:
        self._by_use.remove((region.last_access, region.index))
        self._by_filling.remove((region.filled_at, region.index))
        if region.reads == 0:
            self._unread.remove((region.filled_at, region.index))

    def least_recently_used(self, count: int) -> list[int]:
        """The indices of the ``count`` regions used least recently, least first."""
        return [index for _, index in islice(self._by_use, count)]

    def victim(self, ranking: Ranking, may_take: Callable[[int], bool]) -> tuple[Rank, int] | None:
        """The region to evict first among those ``may_take`` (by index) allows, with its rank;
        None if it allows none."""
        if ranking == Ranking.SCAN_RESISTANT:
            for filled_at, index in self._unread_old():
                if may_take(index):
                    return (0, filled_at), index
        for last_access, index in self._by_use:
            if may_take(index):
                return (1, last_access), index
        return None

    def _unread_old(self) -> Iterator[tuple[int, int]]:
        """The unread regions among the oldest ``UNREAD_OLDEST_SHARE`` by filling, oldest
        first."""
        oldest = int(len(self._by_filling) * UNREAD_OLDEST_SHARE)
        if not oldest:
            return
        cutoff = self._by_filling[oldest][0]
        for filled_at, index in self._unread:
            if filled_at >= cutoff:
                return
            yield filled_at, index
