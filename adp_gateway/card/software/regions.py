"""The software card's parts: a database (its device, superblock and regions), a region and its
state, a run of records written together, tenant pools, record locations. The region log
(regionlog.py) decides what to do with them; these only hold state and do the
database's own start-up I/O (superblock, format, which blocks were never written).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from adp_gateway.card.software.devices.base import Device
from adp_gateway.card.software.devices.groupsync import GroupSync
from adp_gateway.card.software.devices.preparer import unwritten_ranges
from adp_gateway.card.software.recovery import aligned
from adp_gateway.card.software.sealing import TRAILER_BYTES, FooterRow, entry_bytes_max
from adp_gateway.errors import StartupError
from adp_gateway.format import (
    HEADER_BYTES,
    RecordHeader,
    Superblock,
    pack_header,
    pack_superblock,
    unpack_superblock,
)
from adp_gateway.ring.layout import PAGE_BYTES, align_up

log = logging.getLogger(__name__)


class Location(NamedTuple):
    database: int
    region: int
    epoch: int
    offset: int  # of the record's header, from the start of the device
    record_bytes: int


@dataclass(frozen=True)
class Pools:
    """Tenant with a quota -> the regions per database its pool may own; all other tenants
    share the pool ``SHARED``, of the regions the limits leave."""

    limits: Mapping[str, int] = field(default_factory=dict)
    SHARED = ""

    def of(self, tenant: str) -> str:
        return tenant if tenant in self.limits else self.SHARED

    def limit(self, pool: str, regions: int) -> int:
        return self.limits.get(pool, regions - sum(self.limits.values()))


class RegionRecords(NamedTuple):
    """What a recovery found in one region: its records as footer rows (sealing.py)."""

    database: int
    region: int
    epoch: int
    start: int  # the region's offset on the device; a row's record is at start + row[0]
    rows: list[FooterRow]


@dataclass
class Region:
    index: int
    epoch: int = 0  # 0: free
    pool: str = Pools.SHARED
    used_bytes: int = 0
    writes_inflight: int = 0  # record writes, and the footer's
    reads_inflight: int = 0  # a region being read is not reclaimed
    sealed: bool = False  # takes no more appends; its footer follows its last write
    footer_bytes: int = 0  # upper bound of the footer of what was reserved so far
    last_access: int = 0
    live: int = 0  # records the store uses
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

    def fits(self, header: RecordHeader, region_bytes: int) -> bool:
        footer = align_up(self.footer_bytes + entry_bytes_max(header))
        return self.used_bytes + header.record_bytes + footer + TRAILER_BYTES <= region_bytes

    def refill(self, epoch: int, now: int, pool: str) -> None:
        self.epoch, self.last_access, self.pool = epoch, now, pool
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
        self.salt = self._load_or_format_superblock()
        self.group_sync = GroupSync(device)
        self.busy = 0  # appends and reads in progress; under the log's lock
        self.last_io = 0.0  # monotonic time the last of them ended
        self.takes = self.takes_seen = 0  # regions taken, and as the preparer last counted
        self._find_unwritten()

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

    def _load_or_format_superblock(self) -> int:
        page = aligned(PAGE_BYTES)
        self.device.read([page], 0)
        found = unpack_superblock(page)
        if found is not None:
            if found.region_bytes != self.region_bytes:
                raise StartupError(
                    f"database {self.index} was formatted with region_size {found.region_bytes}, "
                    f"the config says {self.region_bytes}: restore region_size or use a new "
                    "data dir"
                )
            return found.salt
        if any(page):
            log.warning(
                "database %d has no valid superblock but is not empty: formatting it "
                "(whatever it held is lost)",
                self.index,
            )
        salt = secrets.randbits(64)
        pack_superblock(Superblock(self.index, self.region_bytes, salt), page)
        # A new superblock invalidates whatever an earlier format left in the regions.
        self.device.write([page], 0)
        for region in self.regions:
            self.device.write([aligned(PAGE_BYTES)], self.region_offset(region.index))
        self.device.sync()
        return salt


class _HeaderPages(threading.local):
    """Each I/O thread's page-aligned buffer for the headers of the records it writes or reads:
    they are used only inside the thread's own synchronous pwritev/preadv and unpacked before
    it returns, so one buffer per thread serves every call (an mmap per call cost 10 us)."""

    def __init__(self) -> None:
        self.buffer = aligned(HEADER_BYTES)

    def take(self, pages: int) -> memoryview:
        if len(self.buffer) < pages * HEADER_BYTES:
            self.buffer = aligned(align_up(pages * HEADER_BYTES, 16 * HEADER_BYTES))
        return self.buffer[: pages * HEADER_BYTES]


header_pages = _HeaderPages()


def pack_run(db: Database, run: Run, payloads: list[memoryview | None]) -> list[memoryview]:
    """A run's buffers: each record's header page, then its payload (if any)."""
    pages = header_pages.take(len(run.headers))
    buffers = []
    for i, (header, payload) in enumerate(zip(run.headers, payloads, strict=True)):
        page = pages[i * HEADER_BYTES : (i + 1) * HEADER_BYTES]
        pack_header(header, page, db.salt)
        buffers += [page] if payload is None else [page, payload]
    return buffers
