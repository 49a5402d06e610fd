"""The software card's eviction policy: which region to reclaim when a pool needs one and no
free region may be taken.

Regions are reclaimed whole, in approximate-LRU order: a region that holds nothing the store
still uses goes first (a deleted or overwritten object's), then the one least recently written
or read. The store reports which records it uses with ``retain``/``release`` (``count_live``); a
region with reads or writes in flight, or open for appends, is never chosen.
"""

from __future__ import annotations

from collections.abc import Iterable

from adp_gateway.card.software.regions import Database, Location, LogState, Region
from adp_gateway.errors import StorageError


def choose_victim(db: Database, pools: set[str], wanted_by: str) -> Region:
    """Under the log's lock: the region of one of ``pools`` to reclaim for pool ``wanted_by``.
    Raises StorageError when every candidate is busy."""
    opened = set(map(id, db.open.values()))
    idle = [
        r
        for r in db.regions
        if r.epoch
        and r.pool in pools
        and r.writes_inflight == r.reads_inflight == 0
        and id(r) not in opened
    ]
    if not idle:
        raise StorageError(
            f"database {db.index} has no region to reclaim for "
            f"{'tenant ' + repr(wanted_by) if wanted_by else 'the shared pool'}; every one it "
            "may take has reads or writes in flight"
        )
    return min(idle, key=lambda r: (r.live > 0, r.last_access))


def count_live(state: LogState, locations: Iterable[Location], delta: int) -> None:
    """The store uses (``delta`` 1) or no longer uses (-1) these records."""
    with state.lock:
        for location in locations:
            region = state.region_of(location)
            if region.epoch == location.epoch:
                region.live += delta


def touch(state: LogState, region: Region) -> None:
    """Under the lock: ``region`` was just read (it moves to the back of the eviction order)."""
    region.last_access = next(state.clock)
