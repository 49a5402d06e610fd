"""Allocation of regions, and the tenant pools that bound it.

Regions belong to pools. A tenant with a quota has a pool of its own, of at most its limit of
regions per database; when it is full, the tenant's next region is one of its own, reclaimed, so
no tenant ever evicts another's objects to make room. Every other tenant shares the pool ``""``
(all of the card when no tenant has a quota). A region's pool is named in its first record.

Every filling of a region starts with a header-only record naming its epoch (and then the
tombstones it carries), which also keeps a copy of the database's superblock. It travels in
the region's first write, in front of that write's records (records.py), so opening a region
costs no I/O of its own.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from adp_gateway.card.software.devices.reader import aligned
from adp_gateway.card.software.eviction import choose_victim
from adp_gateway.card.software.format import (
    HEADER_BYTES,
    Kind,
    RecordHeader,
    pack_header,
    pack_region_start,
)
from adp_gateway.card.software.regions import SHARED_POOL, Database, LogState, Region
from adp_gateway.card.software.sealing import entry_bytes_max, fits

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pools:
    """Tenant with a quota -> the regions per database its pool may own; all other tenants
    share the pool ``SHARED``, of the regions the limits leave."""

    limits: Mapping[str, int] = field(default_factory=dict)
    SHARED = SHARED_POOL

    def of(self, tenant: str) -> str:
        return tenant if tenant in self.limits else self.SHARED

    def limit(self, pool: str, regions: int) -> int:
        return self.limits.get(pool, regions - sum(self.limits.values()))


class Allocator:
    """Takes a region for a pool to fill: a free one while the pool is below its limit, else
    one reclaimed (eviction.py chooses which)."""

    def __init__(self, state: LogState, pools: Pools) -> None:
        self._state = state
        self.pools = pools

    def pool_bytes(self, tenant: str) -> tuple[int, int]:
        """The bytes of the regions held by ``tenant``'s pool, and the most it may hold."""
        pool = self.pools.of(tenant)
        databases = self._state.databases
        with self._state.lock:
            held = sum(db.regions_held(pool) * db.region_bytes for db in databases)
        limit = sum(self.pools.limit(pool, len(db.regions)) * db.region_bytes for db in databases)
        return held, limit

    def take(self, db: Database, pool: str) -> Region:
        """A region for ``pool`` to open (under the lock): a free one while the pool is below
        its limit, else the best of its own to reclaim (or of a pool over its limit, as a
        lowered quota leaves). Raises StorageError when none may be taken."""
        state = self._state
        db.takes += 1
        held = db.count_regions()
        below = held[pool] < self.pools.limit(pool, len(db.regions))
        free = db.next_free() if below else None  # written-once regions first, then in order
        if free is not None:
            region, carried = free, free.carried
        else:
            over = {p for p, n in held.items() if n > self.pools.limit(p, len(db.regions))}
            # Below its limit with none free (the preparer may hold the last), a pool takes
            # from one over its limit, or else from its own.
            region = choose_victim(state, db, (over or {pool}) if below else {pool}, pool)
            carried = state.on_reclaim(db.index, region.index, region.epoch)
            state.reclaims += 1
        db.refill(region, state.next_epoch, next(state.clock), pool)
        state.next_epoch += 1
        region.carried = []
        region.prepared_bytes = 2**62  # its filling writes it: prepared for the next one
        region.prologue = self._prologue(db, region, carried)
        return region

    def _prologue(
        self, db: Database, region: Region, carried: list[RecordHeader]
    ) -> list[memoryview]:
        """The first pages of a filling, reserved now and written in front of its first run:
        the start record, which gives its new epoch to any recovery, then the carried
        tombstones."""
        start = RecordHeader(Kind.REGION, 0, region.pool, "", 0, epoch=region.epoch)
        pages = []
        for record in [start, *(dataclasses.replace(r, epoch=region.epoch) for r in carried)]:
            if not fits(region, record, db.region_bytes):
                log.error("database %d: %d tombstones not carried", db.index, len(carried))
                break
            page = aligned(HEADER_BYTES)
            if record is start:  # it keeps a copy of the superblock (superblocks.py)
                pack_region_start(record, db.superblock, page, db.salt)
            else:
                pack_header(record, page, db.salt)
            pages.append(page)
            if record is not start:
                region.records.append((region.used_bytes, record))
                region.footer_bytes += entry_bytes_max(record)
            db.reserve(region, HEADER_BYTES)
        return pages
