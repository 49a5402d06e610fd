"""The software card: a log-structured region store, one per database (device).

Each device is ``[superblock 4 KiB][region 0][region 1]...``. Records (gateway/format.py) are
appended to the database's one open region; when it is full it is sealed and a free region is
opened. When none is free, the oldest sealed region (FIFO by epoch) with no write in flight is
reclaimed whole: ``on_reclaim(database, region, epoch)`` tells the store to forget what it held,
then the region gets a new epoch and is overwritten from its start.

Every record carries its region's epoch, so a recovery scan walks a region from its start and
stops at the first header that is invalid or from an older epoch. A hole left by a torn or failed
write is skipped by scanning forward page by page for the next valid header of the same epoch.

Thread-safety: ``append`` and ``read`` run concurrently from the I/O threads; only space
reservation is under the lock, the I/O itself is not.
"""

from __future__ import annotations

import dataclasses
import logging
import mmap
import secrets
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from gateway.backends.base import Device
from gateway.backends.groupsync import GroupSync
from gateway.errors import StartupError, StorageError
from gateway.format import (
    HEADER_BYTES,
    RECORD_MAGIC,
    RecordHeader,
    Superblock,
    pack_header,
    pack_superblock,
    unpack_header,
    unpack_superblock,
)
from gateway.ring.layout import PAGE_BYTES

log = logging.getLogger(__name__)
SCAN_CHUNK_BYTES = 8 * 2**20


class Location(NamedTuple):
    database: int
    region: int
    epoch: int
    offset: int  # of the record's header, from the start of the device
    record_bytes: int


@dataclass
class _Region:
    index: int
    epoch: int = 0  # 0: free
    used_bytes: int = 0
    writes_inflight: int = 0


class _Database:
    def __init__(self, index: int, device: Device, region_bytes: int) -> None:
        self.index = index
        self.device = device
        self.region_bytes = region_bytes
        count = (device.size_bytes - PAGE_BYTES) // region_bytes
        self.regions = [_Region(i) for i in range(count)]
        self.open: _Region | None = None
        self.salt = self._load_or_format_superblock()
        self.group_sync = GroupSync(device)

    def region_offset(self, region: int) -> int:
        return PAGE_BYTES + region * self.region_bytes

    def _load_or_format_superblock(self) -> int:
        page = _aligned(PAGE_BYTES)
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
        salt = secrets.randbits(64)
        pack_superblock(Superblock(self.index, self.region_bytes, salt), page)
        # A new superblock invalidates whatever an earlier format left in the regions.
        self.device.write([page], 0)
        for region in self.regions:
            self.device.write([_aligned(PAGE_BYTES)], self.region_offset(region.index))
        self.device.sync()
        return salt


class RegionLog:
    def __init__(
        self, devices: list[Device], region_bytes: int, on_reclaim: Callable[[int, int, int], None]
    ) -> None:
        assert region_bytes % PAGE_BYTES == 0
        self._databases = [_Database(i, d, region_bytes) for i, d in enumerate(devices)]
        for db in self._databases:
            if len(db.regions) < 2:
                raise StartupError(
                    f"database {db.index} has room for {len(db.regions)} "
                    "region(s); it needs at least 2: raise `capacity` or lower "
                    "`region_size`"
                )
        self.region_bytes = region_bytes
        self._on_reclaim = on_reclaim
        self._lock = threading.Lock()
        self._next_epoch = 1
        self._local = threading.local()

    @property
    def databases(self) -> int:
        return len(self._databases)

    @property
    def capacity_bytes(self) -> int:
        return sum(len(db.regions) * db.region_bytes for db in self._databases)

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return sum(r.used_bytes for db in self._databases for r in db.regions if r.epoch)

    def append(self, database: int, header: RecordHeader, payload: memoryview | None) -> Location:
        """Write one record; ``payload`` is page aligned, its length a multiple of 4 KiB."""
        db = self._databases[database]
        location = self._reserve(db, header.record_bytes)
        page = self._header_page()
        pack_header(dataclasses.replace(header, epoch=location.epoch), page, db.salt)
        try:
            db.device.write([page] if payload is None else [page, payload], location.offset)
            db.group_sync.wrote()
        except OSError as exc:
            raise StorageError(f"write to database {database} failed: {exc}") from exc
        finally:
            with self._lock:
                db.regions[location.region].writes_inflight -= 1
        return location

    def read(self, location: Location, payload: memoryview | None) -> RecordHeader | None:
        """Read the record at ``location``; None when its header is not valid any more."""
        db = self._databases[location.database]
        page = self._header_page()
        try:
            db.device.read([page] if payload is None else [page, payload], location.offset)
        except OSError as exc:
            raise StorageError(f"read from database {location.database} failed: {exc}") from exc
        header = unpack_header(page, db.salt)
        if header is None or header.epoch != location.epoch:
            return None
        return header

    def sync(self, databases: set[int]) -> None:
        """Make every write completed so far on ``databases`` durable (group commit)."""
        for database in databases:
            try:
                self._databases[database].group_sync.sync()
            except OSError as exc:
                raise StorageError(f"sync of database {database} failed: {exc}") from exc

    def close(self) -> None:
        for db in self._databases:
            db.device.close()

    def scan(self) -> Iterator[tuple[Location, RecordHeader]]:
        """Yield every record on the devices; call once, before the first append."""
        for db in self._databases:
            for region in db.regions:
                yield from self._scan_region(db, region)
        live = [r.epoch for db in self._databases for r in db.regions]
        self._next_epoch = max(live, default=0) + 1

    def _scan_region(
        self, db: _Database, region: _Region
    ) -> Iterator[tuple[Location, RecordHeader]]:
        start = db.region_offset(region.index)
        page = _aligned(PAGE_BYTES)
        db.device.read([page], start)
        first = unpack_header(page, db.salt)
        if first is None:
            return
        region.epoch = first.epoch
        offset = 0
        while offset + HEADER_BYTES <= db.region_bytes:
            db.device.read([page], start + offset)
            header = unpack_header(page, db.salt)
            if header is None or header.epoch != region.epoch:
                found = self._resync(db, region, offset + PAGE_BYTES)
                if found is None:
                    break
                offset = found
                continue
            if offset + header.record_bytes > db.region_bytes:
                break
            yield (
                Location(db.index, region.index, region.epoch, start + offset, header.record_bytes),
                header,
            )
            offset += header.record_bytes
            region.used_bytes = offset

    def _resync(self, db: _Database, region: _Region, offset: int) -> int | None:
        """The offset of the next valid header of this region's epoch at or after ``offset``."""
        start = db.region_offset(region.index)
        chunk = _aligned(SCAN_CHUNK_BYTES)
        while offset + HEADER_BYTES <= db.region_bytes:
            length = min(SCAN_CHUNK_BYTES, db.region_bytes - offset)
            view = chunk[:length]
            db.device.read([view], start + offset)
            for page_at in range(0, length - HEADER_BYTES + 1, PAGE_BYTES):
                if view[page_at : page_at + 8] != RECORD_MAGIC:
                    continue
                header = unpack_header(view[page_at : page_at + HEADER_BYTES], db.salt)
                if header is not None and header.epoch == region.epoch:
                    log.warning(
                        "database %d region %d: skipped a damaged record before offset %d",
                        db.index,
                        region.index,
                        offset + page_at,
                    )
                    return offset + page_at
            offset += length
        return None

    def _reserve(self, db: _Database, record_bytes: int) -> Location:
        if record_bytes > db.region_bytes:
            raise StorageError(
                f"a record of {record_bytes} bytes does not fit a region of "
                f"{db.region_bytes}: raise `region_size` above `fragment_size`"
            )
        with self._lock:
            region = db.open
            if region is None or region.used_bytes + record_bytes > db.region_bytes:
                region = db.open = self._take_region(db)
            offset = region.used_bytes
            region.used_bytes += record_bytes
            region.writes_inflight += 1
            return Location(
                db.index,
                region.index,
                region.epoch,
                db.region_offset(region.index) + offset,
                record_bytes,
            )

    def _take_region(self, db: _Database) -> _Region:
        """A region to open, reclaiming the oldest sealed one when none is free (under the lock)."""
        free = [r for r in db.regions if r.epoch == 0]
        if free:
            region = free[0]
        else:
            sealed = [r for r in db.regions if r is not db.open and r.writes_inflight == 0]
            if not sealed:
                raise StorageError(
                    f"database {db.index} has no region to reclaim; every region "
                    "has writes in flight"
                )
            region = min(sealed, key=lambda r: r.epoch)
            self._on_reclaim(db.index, region.index, region.epoch)
        region.epoch = self._next_epoch
        self._next_epoch += 1
        region.used_bytes = 0
        return region

    def _header_page(self) -> memoryview:
        page: memoryview | None = getattr(self._local, "page", None)
        if page is None:
            page = self._local.page = _aligned(PAGE_BYTES)
        return page


def _aligned(size: int) -> memoryview:
    """A page-aligned, zeroed buffer (anonymous mmap), as O_DIRECT requires."""
    return memoryview(mmap.mmap(-1, size))
