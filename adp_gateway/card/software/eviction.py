"""The software card's eviction: which region to reclaim when a pool needs one and no free
region may be taken, and what the ranking goes by.

Regions are reclaimed whole, in the order victims.py ranks them (the config's ``eviction``:
``scan-resistant`` by default, or ``lru``): a region that holds nothing the store
still uses (a deleted or overwritten object's) goes first whatever the ranking. A database of
more than ``victims.SAMPLE_REGIONS`` regions is ranked over that many drawn at random at each
take, so the cost of a take does not grow with the drive. The store
reports which records it uses with ``retain``/``release`` (``count_live``); a region with reads
or writes in flight, or open for appends, is never chosen. Each reclaim tells the log's
``EvictionAges`` how long the region had gone unused, which admission weighs
(adp_gateway/policy/admission.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import numpy as np

from adp_gateway.card.software import victims
from adp_gateway.card.software.regions import Database, Location, LogState, Region
from adp_gateway.errors import StorageError


def choose_victim(state: LogState, db: Database, pools: set[str], wanted_by: str) -> Region:
    """Under the log's lock: the region of one of ``pools`` to reclaim for pool ``wanted_by``.
    Raises StorageError when every candidate is busy."""
    opened = set(map(id, db.open.values()))

    def idle(regions: Iterable[Region]) -> list[Region]:
        return [
            r
            for r in regions
            if r.epoch
            and r.pool in pools
            and r.writes_inflight == r.reads_inflight == 0
            and id(r) not in opened
        ]

    # Emptied regions first; else ranked over a sample drawn before the filter: a pass over
    # every region costs milliseconds on a drive's worth of them, under the lock, at each take.
    candidates = idle(r for r in db.emptied.values() if r.live == 0)
    if not candidates:
        picked = victims.sample(len(db.regions), state.sampling)
        candidates = idle(db.regions if picked is None else [db.regions[i] for i in picked])
        if not candidates and picked is not None:  # the sample held none: look at them all
            candidates = idle(db.regions)
    if not candidates:
        raise StorageError(
            f"database {db.index} has no region to reclaim for "
            f"{'tenant ' + repr(wanted_by) if wanted_by else 'the shared pool'}; every one it "
            "may take has reads or writes in flight"
        )
    columns = np.array(
        [(r.live, r.last_access, r.filled_at, r.reads) for r in candidates], np.int64
    )
    region = candidates[victims.choose_victim(state.ranking, *columns.T)]
    db.emptied = {i: r for i, r in db.emptied.items() if r.live == 0 and r is not region}
    if region.last_access_s:  # known: not a region recovered at start-up and unused since
        now_s = time.monotonic()
        state.evictions.evicted(now_s - region.last_access_s, now_s)
    return region


def count_live(state: LogState, locations: Iterable[Location], delta: int) -> None:
    """The store uses (``delta`` 1) or no longer uses (-1) these records."""
    with state.lock:
        for location in locations:
            region = state.region_of(location)
            if region.epoch == location.epoch:
                region.live += delta
                if region.live == 0:
                    state.databases[location.database].emptied[region.index] = region


def touch(state: LogState, region: Region) -> None:
    """Under the lock: ``region`` was just read (it moves to the back of the eviction order)."""
    region.last_access = next(state.clock)
    region.last_access_s = time.monotonic()
    region.reads += 1
