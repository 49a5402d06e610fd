"""Goal: the software card evicts what is least likely to be read again, whole regions at a
time. An emptied region goes first under either ranking; LRU takes the least recently used;
scan-resistant takes, among the oldest 20 % by filling, a region never read since before one
that was read, yet never a young unread region before an old one; on the card itself, a flood
of objects written once does not push out an older region that was read; and a database too
large to rank every region at each eviction ranks a sample, yet still takes an emptied region
first; and the counts of regions a take keeps, so as not to pass over them all, stay right."""

from __future__ import annotations

import random

import numpy as np

from adp_gateway.card.holdings import NO_HOLDINGS
from adp_gateway.card.software.devices.memory import MemoryDevice
from adp_gateway.card.software.eviction import choose_victim as choose_region
from adp_gateway.card.software.eviction import count_live
from adp_gateway.card.software.pools import Allocator, Pools
from adp_gateway.card.software.regions import SHARED_POOL, Database, Location, LogState
from adp_gateway.card.software.victims import SAMPLE_REGIONS, Ranking, choose_victim, sample
from adp_gateway.objects.catalog import ObjectCatalog
from adp_gateway.objects.store import ObjectStore
from adp_wire.ring.layout import PAGE_BYTES
from tests.support.storage import REGION, extent, open_card, payload


def pick(
    ranking: Ranking, live: list[int], last: list[int], filled: list[int], reads: list[int]
) -> int:
    columns = [np.array(c, np.int64) for c in (live, last, filled, reads)]
    return choose_victim(ranking, *columns)


def test_an_emptied_region_goes_first_whatever_its_use() -> None:
    for ranking in Ranking:
        assert pick(ranking, [3, 0, 2], [1, 90, 2], [1, 80, 2], [0, 5, 0]) == 1


def test_lru_takes_the_least_recently_used() -> None:
    assert pick(Ranking.LRU, [1] * 4, [40, 10, 30, 20], [5, 1, 3, 2], [1, 1, 0, 0]) == 1


def test_scan_resistant_takes_an_old_unread_region_before_an_older_read_one() -> None:
    # Ten regions filled at clocks 0..9; region 0 was read at clock 1, and is the least
    # recently used; region 1 (among the oldest fifth) was never read.
    filled = list(range(10))
    last = [1, 1, 12, 13, 14, 15, 16, 17, 18, 19]
    last[0] = 0
    reads = [1, 0, 1, 1, 1, 1, 1, 1, 1, 1]
    assert pick(Ranking.LRU, [1] * 10, last, filled, reads) == 0
    assert pick(Ranking.SCAN_RESISTANT, [1] * 10, last, filled, reads) == 1


def test_scan_resistant_spares_young_unread_regions() -> None:
    # Region 8 is unread but among the newest 80 %: the LRU region (0, read at 5) goes.
    filled = list(range(10))
    last = [5, 11, 12, 13, 14, 15, 16, 17, 8, 19]
    reads = [1, 1, 1, 1, 1, 1, 1, 1, 0, 1]
    assert pick(Ranking.SCAN_RESISTANT, [1] * 10, last, filled, reads) == 0


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
    """A database of ``count`` small regions, all filled and idle, none read, LRU order
    shuffled against fill order."""
    db = Database(0, MemoryDevice(4096 + count * 8192), 8192)
    state = LogState([db], lambda *region: [])
    order = random.Random(1).sample(range(count), count)
    for region, rank in zip(db.regions, order, strict=True):
        region.epoch, region.live = rank + 1, 1
        region.filled_at = region.last_access = rank
    return state, db


def test_a_large_database_is_ranked_over_a_sample_but_an_emptied_region_still_goes_first() -> None:
    count = SAMPLE_REGIONS + 1000
    state, db = big_database(count)
    chosen = choose_region(state, db, {""}, "")
    assert chosen.last_access < count * 0.01  # among the oldest 1 %, if not the oldest
    emptied = db.regions[1234]
    count_live(state, [Location(db.index, emptied.index, emptied.epoch, 0, 0)], -1)
    assert choose_region(state, db, {""}, "") is emptied
    assert sample(SAMPLE_REGIONS, random.Random(0)) is None
    assert len(set(sample(count, random.Random(0)) or [])) == SAMPLE_REGIONS


def test_the_counts_a_take_keeps_are_what_a_recount_finds() -> None:
    """A take keeps each database's count of regions held by each pool and of free regions,
    so that once none is free it passes over no more than a sample of them. Through fillings,
    reclaims and emptied regions, under quotas, the counts it kept are those a count from
    scratch finds, and an emptied region is the next taken."""
    db = Database(0, MemoryDevice(PAGE_BYTES + 40 * REGION), REGION)
    state = LogState([db], lambda *region: [])
    allocator = Allocator(state, Pools({"a": 10, "b": 5}))
    rng = random.Random(2)
    for _ in range(300):
        region = allocator.take(db, rng.choice(["a", "b", SHARED_POOL]))
        region.live = 1
        assert db.held is not None
        kept = (dict(+db.held), db.free_regions)
        db.held = None
        assert (dict(+db.count_regions()), db.free_regions) == kept
    assert kept == ({"a": 10, "b": 5, SHARED_POOL: 25}, 0)
    victim = max((r for r in db.regions if r.pool == "b"), key=lambda r: r.last_access)
    count_live(state, [Location(db.index, victim.index, victim.epoch, 0, 0)], -1)
    assert allocator.take(db, "b") is victim
