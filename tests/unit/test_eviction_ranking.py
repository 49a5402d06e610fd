"""Goal: the software card evicts what is least likely to be read again, whole regions at a
time. An emptied region goes first under either ranking; LRU takes the least recently used;
scan-resistant takes, among the oldest 20 % by filling, a region never read since before one
that was read, yet never a young unread region before an old one; on the card itself, a flood
of objects written once does not push out an older region that was read; a database of many
regions is ranked whole (the very best victim, a busy one passed over), and an emptied region
still goes first; and the counts and orders a take and a read keep, so as not to pass over
every region, are what a recount finds."""

from __future__ import annotations

import random

from adp_gateway.card.holdings import NO_HOLDINGS
from adp_gateway.card.software.devices.memory import MemoryDevice
from adp_gateway.card.software.eviction import choose_victim, count_live
from adp_gateway.card.software.pools import Allocator, Pools
from adp_gateway.card.software.regions import SHARED_POOL, Database, Location, LogState, Region
from adp_gateway.card.software.victims import EvictionOrder, Ranking
from adp_gateway.objects.catalog import ObjectCatalog
from adp_gateway.objects.store import ObjectStore
from adp_wire.ring.layout import PAGE_BYTES
from tests.support.storage import REGION, extent, open_card, payload


def pick(ranking: Ranking, last: list[int], filled: list[int], reads: list[int]) -> int:
    order = EvictionOrder()
    for index, row in enumerate(zip(last, filled, reads, strict=True)):
        order.add(Region(index, epoch=1, last_access=row[0], filled_at=row[1], reads=row[2]))
    found = order.victim(ranking, lambda index: True)
    assert found is not None
    return found[1]


def test_an_emptied_region_goes_first_whatever_its_use() -> None:
    for ranking in Ranking:
        state, db = big_database(3)
        state.ranking = ranking
        db.regions[1].live = 0
        db.regions[1].reads = 5
        db.regions[1].last_access = 90
        db.held = None
        db.count_regions()
        assert choose_victim(state, db, {SHARED_POOL}, "") is db.regions[1]


def test_lru_takes_the_least_recently_used() -> None:
    assert pick(Ranking.LRU, [40, 10, 30, 20], [5, 1, 3, 2], [1, 1, 0, 0]) == 1


def test_scan_resistant_takes_an_old_unread_region_before_an_older_read_one() -> None:
    # Ten regions filled at clocks 0..9; region 0 was read at clock 1, and is the least
    # recently used; region 1 (among the oldest fifth) was never read.
    filled = list(range(10))
    last = [1, 1, 12, 13, 14, 15, 16, 17, 18, 19]
    last[0] = 0
    reads = [1, 0, 1, 1, 1, 1, 1, 1, 1, 1]
    assert pick(Ranking.LRU, last, filled, reads) == 0
    assert pick(Ranking.SCAN_RESISTANT, last, filled, reads) == 1


def test_scan_resistant_spares_young_unread_regions() -> None:
    # Region 8 is unread but among the newest 80 %: the LRU region (0, read at 5) goes.
    filled = list(range(10))
    last = [5, 11, 12, 13, 14, 15, 16, 17, 8, 19]
    reads = [1, 1, 1, 1, 1, 1, 1, 1, 0, 1]
    assert pick(Ranking.SCAN_RESISTANT, last, filled, reads) == 0


def test_a_flood_written_once_does_not_push_out_an_older_region_that_was_read() -> None:
    """Thirty regions; the first one's objects are read once, early; then objects written once
    and never read fill the card twice over. Under LRU the read region goes as soon as it is
    the least recently used; scan-resistant keeps it while unread regions are as old."""
    kept = {}
    for ranking in Ranking:
        catalog = ObjectCatalog(NO_HOLDINGS)
        card = open_card([MemoryDevice(4096 + 30 * REGION)], False, None, catalog, ranking)
        store = ObjectStore(card, catalog)
        store.recover()
        data = payload(1, 40_000)
        for i in range(5):
            store.put("t", f"read{i}", extent(data), len(data))
        for i in range(5):
            assert store.get("t", f"read{i}", extent(bytes(40_000)), 40_000)
        for i in range(300):
            store.put("t", f"once{i}", extent(payload(i, 40_000)), 40_000)
        kept[ranking] = sum(store.exists("t", [f"read{i}" for i in range(5)]))
    assert kept == {Ranking.LRU: 0, Ranking.SCAN_RESISTANT: 5}


def big_database(count: int) -> tuple[LogState, Database]:
    """A database of ``count`` small regions, all filled and idle, none read, filled in an
    order shuffled against their indices, and counted."""
    db = Database(0, MemoryDevice(PAGE_BYTES + count * 8192), 8192)
    state = LogState([db], lambda *region: [])
    order = random.Random(1).sample(range(count), count)
    for region, rank in zip(db.regions, order, strict=True):
        region.epoch, region.live = rank + 1, 1
        region.filled_at = region.last_access = rank
    db.count_regions()
    return state, db


def test_a_large_database_is_ranked_whole_and_an_emptied_region_still_goes_first() -> None:
    count = 20_000
    for ranking in Ranking:
        state, db = big_database(count)
        state.ranking = ranking
        by_rank = sorted(db.regions, key=lambda r: r.filled_at)
        assert choose_victim(state, db, {SHARED_POOL}, "") is by_rank[0]
        by_rank[0].reads_inflight = 1  # being read: passed over
        assert choose_victim(state, db, {SHARED_POOL}, "") is by_rank[1]
        emptied = db.regions[1234]
        count_live(state, [Location(db.index, emptied.index, emptied.epoch, 0, 0)], -1)
        assert choose_victim(state, db, {SHARED_POOL}, "") is emptied


def test_the_counts_and_orders_a_take_and_a_read_keep_are_what_a_recount_finds() -> None:
    """A take keeps each database's count of regions held by each pool and of free regions,
    and each pool's eviction order, as a read does, so that once none is free it passes over
    none of them. Through fillings, reclaims, reads and emptied regions, under quotas, what it
    kept is what a count from scratch finds, and an emptied region is the next taken."""
    db = Database(0, MemoryDevice(PAGE_BYTES + 40 * REGION), REGION)
    state = LogState([db], lambda *region: [])
    allocator = Allocator(state, Pools({"a": 10, "b": 5}))
    rng = random.Random(2)

    def kept() -> tuple[dict[str, int], int, dict[str, list[int]]]:
        assert db.held is not None
        orders = {p: o.least_recently_used(len(o)) for p, o in db.orders.items() if len(o)}
        return dict(+db.held), db.free_regions, orders

    for _ in range(300):
        region = allocator.take(db, rng.choice(["a", "b", SHARED_POOL]))
        region.live = 1
        filled = [r for r in db.regions if r.epoch]
        for read in rng.sample(filled, min(3, len(filled))):
            db.touch(read, next(state.clock))
        before = kept()
        db.held = None
        db.count_regions()
        assert kept() == before
    assert kept()[:2] == ({"a": 10, "b": 5, SHARED_POOL: 25}, 0)
    victim = max((r for r in db.regions if r.pool == "b"), key=lambda r: r.last_access)
    count_live(state, [Location(db.index, victim.index, victim.epoch, 0, 0)], -1)
    assert allocator.take(db, "b") is victim
