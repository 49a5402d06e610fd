"""The software card's state: a database (its device, superblock and regions), a region, a run
of records written together, record locations, and the log's shared state. The modules of the
region log (pools, eviction, records, sealing, recovery) decide what to do with them; these only
hold state and do the database's own start-up I/O (superblock, format, which blocks were never
written).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from adp_gateway.card.software.devices.base import Device
from adp_gateway.card.software.devices.groupsync import GroupSync
from adp_gateway.card.software.devices.preparer import unwritten_ranges
from adp_gateway.card.software.eviction_ages import EvictionAges
from adp_gateway.card.software.format import HEADER_BYTES, RecordHeader
from adp_gateway.card.software.superblocks import open_superblock
from adp_gateway.card.software.victims import EvictionOrder, Ranking
from adp_wire.ring.layout import PAGE_BYTES


class Location(NamedTuple):
    database: int
    region: int
    epoch: int
    offset: int  # of the record's header, from the start of the device
    record_bytes: int


SHARED_POOL = ""  # the pool of every tenant without a quota (pools.py)
OnReclaim = Callable[[int, int, int], list[RecordHeader]]


@dataclass
class Region:
    index: int
    epoch: int = 0  # 0: free
    pool: str = SHARED_POOL
    used_bytes: int = 0
    writes_inflight: int = 0  # record writes, and the footer's
    reads_inflight: int = 0  # a region being read is not reclaimed
    sealed: bool = False  # takes no more appends; its footer follows its last write
    footer_bytes: int = 0  # upper bound of the footer of what was reserved so far
    last_access: int = 0
    # For the eviction's ranking (adp_gateway/card/software/victims.py): reads since this filling
    # began, and when it was last written or read (monotonic seconds; 0 unknown).
    reads: int = 0
    last_access_s: float = 0.0
    live: int = 0  # records the store uses
    # The filling the region's first page names on disk for sure, and the fillings whose first
    # write landed since, each with its write's ticket (devices/groupsync.py) until a sync
    # covers it: after a kill a restart reads the newest of them, after a power cut any one.
    disk_epoch: int = 0
    landed: list[tuple[int, int]] = field(default_factory=list)
    records: list[tuple[int, RecordHeader]] = field(default_factory=list)  # written, for the footer
    # The filling's first pages (its start record and carried tombstones), written in front of
    # the first run reserved in it; None once a run took them.
    prologue: list[memoryview] | None = None
    started: bool | None = True  # whether the first write landed; None while it is in flight
    carried: list[RecordHeader] = field(default_factory=list)  # to rewrite at the next filling
    # Bytes from its start known to be written once (devices/preparer.py): a region
    # that holds unwritten blocks costs more to fill the first time.
    prepared_bytes: int = 2**62
    preparing: bool = False  # held by the preparer: not free to take

    def reset(self, epoch: int, now: int, pool: str) -> None:
        """Empty, at the start of filling ``epoch`` (0: free); only ``Database`` calls this,
        as it keeps counts of regions by epoch and pool."""
        self.epoch, self.last_access, self.pool = epoch, now, pool
        self.reads, self.last_access_s = 0, time.monotonic()
        self.used_bytes = self.footer_bytes = self.live = 0
        self.sealed = False
        self.records = []
        self.prologue, self.started = None, None


@dataclass
class Run:
    """Records reserved back to back in one region: one vectored write, led by the region's
    prologue when it is the region's first."""

    region: Region
    offset: int  # on the device, of the records (the prologue lies just before them)
    headers: list[RecordHeader]
    prologue: list[memoryview] = field(default_factory=list)

    @property
    def start(self) -> int:
        return self.offset - len(self.prologue) * HEADER_BYTES


class Database:
    def __init__(self, index: int, device: Device, region_bytes: int) -> None:
        self.index = index
        self.device = device
        self.region_bytes = region_bytes
        count = (device.size_bytes - PAGE_BYTES) // region_bytes
        self.regions = [Region(i) for i in range(count)]
        self.open: dict[str, Region] = {}  # pool -> its region taking appends
        self.superblock = open_superblock(device, index, region_bytes)  # copied in each start
        self.salt = self.superblock.salt
        self.group_sync = GroupSync(device)
        self.busy = 0  # appends and reads in progress; under the log's lock
        self.last_io = 0.0  # monotonic time the last of them ended
        self.takes = self.takes_seen = 0  # regions taken, and as the preparer last counted
        # Regions filled, by pool, and regions never filled (epoch 0): counted from the regions
        # at the first take after recovery, then kept by ``refill`` and ``release``, the only
        # changes to a region's epoch or pool after it, so that neither a take nor a status
        # need pass over every region (a drive's worth of regions is 10**5: a pass costs
        # milliseconds, under the lock).
        self.held: Counter[str] | None = None
        self.free_regions = 0
        self._used_bytes = 0  # of the filled regions; kept with ``held`` by ``reserve``
        # Each pool's filled regions, ranked for eviction (victims.py); kept with ``held``.
        self.orders: dict[str, EvictionOrder] = {}
        # The free regions in the order they are taken: written-once (prepared) first, then by
        # index; None: to sort again (after recovery, and when the preparer gives one back).
        self.free_order: deque[Region] | None = None
        # Regions whose records the store no longer uses (count_live brought them to 0), by
        # index: reclaimed first, whatever the ranking says.
        self.emptied: dict[int, Region] = {}
        self._find_unwritten()

    def count_regions(self) -> Counter[str]:
        """Under the log's lock: ``held``, counted now if not yet, with ``free_regions``,
        their used bytes, ``orders`` and ``emptied`` (after recovery, the regions none of whose
        records the store took)."""
        if self.held is None:
            self.held = Counter(r.pool for r in self.regions if r.epoch)
            self.free_regions = sum(1 for r in self.regions if r.epoch == 0)
            self._used_bytes = self._filled_bytes()
            self.emptied = {r.index: r for r in self.regions if r.epoch and r.live == 0}
            self.free_order = None
            self.orders = {}
            for region in self.regions:
                if region.epoch:
                    self.order(region.pool).add(region)
        return self.held

    def order(self, pool: str) -> EvictionOrder:
        """Under the log's lock, once counted: ``pool``'s regions ranked for eviction."""
        return self.orders.setdefault(pool, EvictionOrder())

    def refill(self, region: Region, epoch: int, now: int, pool: str) -> None:
        """Under the log's lock: ``region``, free or reclaimed from its pool, begins a filling
        for ``pool``: the counts and orders follow. The only change to a region's epoch or pool
        after recovery."""
        held = self.count_regions()
        if region.epoch:
            self._leave_pool(region)
        else:
            self.free_regions -= 1
        held[pool] += 1
        region.reset(epoch, now, pool)
        self.order(pool).add(region)

    def release(self, region: Region) -> None:
        """Under the log's lock: ``region``'s filling is given up (its first write failed):
        the region is free again, and the counts and orders follow."""
        self.count_regions()
        self._leave_pool(region)
        self.free_regions += 1
        self.free_order = None  # sorted again at the next take, with this one among them
        region.reset(0, 0, SHARED_POOL)

    def _leave_pool(self, region: Region) -> None:
        """Under the log's lock, once counted: ``region``'s filling ends, and its pool's
        counts, bytes, order and emptied regions let go of it."""
        assert self.held is not None
        self.held[region.pool] -= 1
        self._used_bytes -= region.used_bytes
        self.order(region.pool).remove(region)
        self.emptied.pop(region.index, None)

    def reserve(self, region: Region, nbytes: int) -> None:
        """Under the log's lock: ``nbytes`` more of ``region``, filled, are used from its end."""
        region.used_bytes += nbytes
        if self.held is not None:  # else the first count sums it
            self._used_bytes += nbytes

    def used_bytes(self) -> int:
        """Under the log's lock: the bytes the filled regions use."""
        if self.held is None:  # not counted yet: recovery may still be placing records
            return self._filled_bytes()
        return self._used_bytes

    def _filled_bytes(self) -> int:
        return sum(r.used_bytes for r in self.regions if r.epoch)

    def regions_held(self, pool: str) -> int:
        """Under the log's lock: how many regions ``pool`` holds."""
        if self.held is None:
            return sum(1 for r in self.regions if r.epoch and r.pool == pool)
        return self.held[pool]

    def touch(self, region: Region, now: int) -> None:
        """Under the log's lock: ``region`` was just read at clock ``now`` (it moves to the
        back of the eviction order)."""
        order = self.order(region.pool) if self.held is not None else None
        if order is not None:  # else the first take ranks it as it is then
            order.remove(region)
        region.last_access = now
        region.last_access_s = time.monotonic()
        region.reads += 1
        if order is not None:
            order.add(region)

    def next_free(self) -> Region | None:
        """Under the log's lock: the free region to fill next (written-once first, then by
        index; none the preparer holds), without a pass over every region at each take."""
        if not self.free_regions:
            return None
        if self.free_order is None:
            written_once = self.region_bytes
            self.free_order = deque(
                sorted(
                    (r for r in self.regions if r.epoch == 0),
                    key=lambda r: (r.prepared_bytes < written_once, r.index),
                )
            )
        while self.free_order and self.free_order[0].epoch:
            self.free_order.popleft()
        return next((r for r in self.free_order if r.epoch == 0 and not r.preparing), None)

    def _find_unwritten(self) -> None:
        """Mark the regions that hold blocks never written, as far as the device can tell."""
        for start, length in unwritten_ranges(self.device):
            first = max(0, (start - PAGE_BYTES) // self.region_bytes)
            for region in self.regions[first:]:
                begin = self.region_offset(region.index)
                if begin >= start + length:
                    break
                if begin + self.region_bytes > start:
                    region.prepared_bytes = min(region.prepared_bytes, max(0, start - begin))

    def idle(self, idle_s: float) -> bool:
        """Under the log's lock: no append or read for ``idle_s``."""
        return not self.busy and time.monotonic() - self.last_io >= idle_s

    def region_offset(self, region: int) -> int:
        return PAGE_BYTES + region * self.region_bytes

    def location(self, region: Region, offset: int, header: RecordHeader) -> Location:
        start = self.region_offset(region.index) + offset
        return Location(self.index, region.index, region.epoch, start, header.record_bytes)


@dataclass
class LogState:
    """What the region log's parts share: the databases, the lock over every region's state
    (held for bookkeeping, never across I/O), and the counters that order fillings."""

    databases: list[Database]
    on_reclaim: OnReclaim
    lock: threading.RLock = field(default_factory=threading.RLock)  # on_reclaim may re-enter
    started: threading.Condition = field(init=False)  # a region's first write is over
    next_epoch: int = 1
    clock: itertools.count[int] = field(default_factory=lambda: itertools.count(1))  # accesses
    reclaims: int = 0
    # Whether a region's new filling counts as replacing the old on disk only once synced (a
    # power cut may keep either until then); off under ``sync: none``, which never syncs.
    durable_fillings: bool = True
    ranking: Ranking = Ranking.SCAN_RESISTANT  # which region eviction takes (eviction.py)
    evictions: EvictionAges = field(default_factory=EvictionAges)  # how long regions lasted

    def __post_init__(self) -> None:
        self.started = threading.Condition(self.lock)

    def region_of(self, location: Location) -> Region:
        return self.databases[location.database].regions[location.region]

    def is_current(self, location: Location) -> bool:
        """Whether the region still holds the filling ``location`` was written in."""
        return self.region_of(location).epoch == location.epoch

    def on_disk(self, location: Location) -> bool:
        """Under the lock: whether a recovery might still find the record at ``location``,
        after a kill or, unless ``durable_fillings`` is off, a power cut. A region just
        reclaimed keeps its old filling on disk until its new first write lands (forever, if
        that write fails), and durably until a sync covers that write."""
        region = self.region_of(location)
        _forget_synced(self.databases[location.database], region)
        return location.epoch == region.disk_epoch or any(
            location.epoch == epoch for epoch, _ in region.landed
        )

    def first_write_landed(self, db: Database, region: Region, ticket: int) -> None:
        """Under the lock: the first write of ``region``'s filling landed (``ticket``: its
        write in the database's group sync)."""
        if self.durable_fillings:
            _forget_synced(db, region)
            region.landed.append((region.epoch, ticket))
        else:
            region.disk_epoch = region.epoch


def _forget_synced(db: Database, region: Region) -> None:
    """Under the lock: the newest of ``region``'s landed fillings that a sync covers is now
    the one on disk for sure; older ones are gone."""
    synced = [epoch for epoch, ticket in region.landed if db.group_sync.covers(ticket)]
    if synced:
        region.disk_epoch = synced[-1]
        region.landed = region.landed[len(synced) :]
