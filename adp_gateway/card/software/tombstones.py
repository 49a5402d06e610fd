"""Tombstones that must outlive their region, so a deleted or overwritten version never returns.

A delete (or an overwrite) appends a tombstone: "every record of this name older than seq is dead".
The dead version's records stay on disk until their own regions are reclaimed, and eviction reclaims
regions in any order. If the tombstone's region went first, a restart would find the old version
complete and bring it back. So when a region holding a tombstone is reclaimed while some record it
shadows is still on disk, the tombstone is carried: rewritten at the start of the region's next
filling (card/software/regionlog.py). "Still on disk" means a recovery might find it: a shadowed
record's region may have been reclaimed already, but until that region's new first write lands, its
old filling is what a restart reads, and until a sync covers that write, what a power cut may leave
(regions.py, ``on_disk``). Only the newest tombstone of a name is kept; it shadows everything older,
so it takes over what every older one shadowed, whichever order they were recorded in.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from adp_gateway.card.software.format import Kind, RecordHeader
from adp_gateway.card.software.regions import Location

ValueId = tuple[str, str]  # (namespace, name)


@dataclass
class _Tombstone:
    seq: int
    database: int
    region: int
    shadowed: tuple[Location, ...]


class Tombstones:
    """Not thread-safe: the store calls it under its own lock."""

    def __init__(self) -> None:
        self._by_value: dict[ValueId, _Tombstone] = {}
        self._by_region: dict[tuple[int, int], set[ValueId]] = defaultdict(set)

    def __len__(self) -> int:
        return len(self._by_value)

    def add(self, value_id: ValueId, seq: int, at: Location, shadowed: Iterable[Location]) -> None:
        old = self._by_value.get(value_id)
        if old is not None and old.seq > seq:  # recorded after a newer one: that one shadows it
            old.shadowed = (*old.shadowed, *shadowed)
            return
        if old is not None:
            shadowed = (*old.shadowed, *shadowed)
            self._by_region[(old.database, old.region)].discard(value_id)
        self._by_value[value_id] = _Tombstone(seq, at.database, at.region, tuple(shadowed))
        self._by_region[(at.database, at.region)].add(value_id)

    def carry(
        self, database: int, region: int, on_disk: Callable[[Location], bool]
    ) -> list[RecordHeader]:
        """The tombstones of a region being reclaimed that still shadow records elsewhere
        (``on_disk``: whether a recovery would find a record)."""
        carried = []
        for value_id in self._by_region.pop((database, region), set()):
            tombstone = self._by_value[value_id]
            tombstone.shadowed = tuple(
                loc
                for loc in tombstone.shadowed
                if on_disk(loc) and (loc.database, loc.region) != (database, region)
            )
            if not tombstone.shadowed:
                del self._by_value[value_id]
                continue
            self._by_region[(database, region)].add(value_id)  # it stays: rewritten in place
            carried.append(RecordHeader(Kind.TOMBSTONE, tombstone.seq, *value_id, 0))
        return carried
