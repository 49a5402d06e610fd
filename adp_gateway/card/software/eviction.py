"""The software card's eviction: which region to reclaim when a pool needs one and no free
region may be taken.

Regions are reclaimed whole. A region that holds nothing the store still uses (a deleted or
overwritten object's) goes first, the one emptied longest ago first (without a pass over them
all: after a restart most regions may be emptied); else the one the pool's
``EvictionOrder`` ranks first (victims.py; the config's ``eviction``: ``scan-resistant`` by
default, or ``lru``). The store reports which records it uses with ``retain``/``release``
(``count_live``); a region with reads or writes in flight, or open for appends, is never
chosen. Each reclaim tells the log's ``EvictionAges`` how long the region had gone unused,
which admission weighs (adp_gateway/policy/admission.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from adp_gateway.card.software.regions import Database, Location, LogState, Region
from adp_gateway.errors import StorageError


def choose_victim(state: LogState, db: Database, pools: set[str], wanted_by: str) -> Region:
    """Under the log's lock, once the regions are counted: the region of one of ``pools`` to
    reclaim for pool ``wanted_by``. Raises StorageError when every candidate is busy."""
    opened = set(map(id, db.open.values()))

    def may_take(region: Region) -> bool:
        return (
            region.pool in pools
            and region.writes_inflight == region.reads_inflight == 0
            and id(region) not in opened
        )

    region = _first_emptied(db, may_take)
    if region is None:
        now = next(state.clock)
        found = [
            ranked
            for pool in pools
            if (
                ranked := db.order(pool).victim(
                    state.ranking, lambda i: may_take(db.regions[i]), now
                )
            )
        ]
        if not found:
            raise StorageError(
                f"database {db.index} has no region to reclaim for "
                f"{'tenant ' + repr(wanted_by) if wanted_by else 'the shared pool'}; every one it "
                "may take has reads or writes in flight"
            )
        region = db.regions[min(found)[1]]
    if region.last_access_s:  # known: not a region recovered at start-up and unused since
        now_s = time.monotonic()
        state.evictions.evicted(now_s - region.last_access_s, now_s)
    return region


def _first_emptied(db: Database, may_take: Callable[[Region], bool]) -> Region | None:
    """The region emptied longest ago that ``may_take`` allows; entries used again since are
    dropped on the way (a refill drops its own)."""
    used_again = []
    found = None
    for index, region in db.emptied.items():
        if region.live:
            used_again.append(index)
        elif may_take(region):
            found = region
            break
    for index in used_again:
        del db.emptied[index]
    return found


def count_live(state: LogState, locations: Iterable[Location], delta: int) -> None:
    """The store uses (``delta`` 1) or no longer uses (-1) these records."""
    with state.lock:
        for location in locations:
            region = state.region_of(location)
            if region.epoch == location.epoch:
                region.live += delta
                if region.live == 0:
                    state.databases[location.database].emptied[region.index] = region
