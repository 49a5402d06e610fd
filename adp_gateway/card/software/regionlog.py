"""The software card's region log: a log-structured region store, one per database (device).

Each device is ``[superblock 4 KiB][region 0][region 1]...``. This class is the log's face; each
concern lives in a module of its own, all sharing one ``LogState`` (regions.py):

==============  ===================================================================
pools.py        taking a region for a pool (tenant quotas), a filling's prologue
eviction.py     which region to reclaim, and the live-record counts it goes by
records.py      appending records (reserve, write, settle) and reading them back
sealing.py      a sealed region's footer: its format, its room, its writing
recovery.py     reading every region back at start-up, and rebuilding the objects
preparation.py  the background preparer's hold on never-written regions
==============  ===================================================================

When no region is free, a sealed region is reclaimed whole (eviction.py). ``on_reclaim(database,
region, epoch)`` tells the store to forget what the region held and returns the records
(tombstones) that must outlive it; they are rewritten at the start of the region's next
filling, before anything else lands there.

Thread-safety: ``append`` and ``read`` run concurrently from the I/O threads; space reservation
and region state are under the lock, the I/O never is.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from adp_gateway.card.software.devices.base import Device
from adp_gateway.card.software.devices.preparer import Preparer
from adp_gateway.card.software.eviction import count_live
from adp_gateway.card.software.format import RecordHeader
from adp_gateway.card.software.pools import Allocator, Pools
from adp_gateway.card.software.preparation import Preparation
from adp_gateway.card.software.records import RecordReader, RecordWriter
from adp_gateway.card.software.recovery import Progress, RegionRecords, RegionScan
from adp_gateway.card.software.regions import Database, Location, LogState, OnReclaim
from adp_gateway.card.software.sealing import Sealer
from adp_gateway.card.software.victims import Ranking
from adp_gateway.errors import StartupError, StorageError
from adp_wire.ring.layout import PAGE_BYTES

__all__ = ["Location", "OnReclaim", "Pools", "Progress", "RegionLog", "RegionRecords"]
PREPARER_STOP_WAIT_S = 5.0  # it writes 8 MiB at a time, only while the disk is idle


class RegionLog:
    def __init__(
        self,
        devices: list[Device],
        region_bytes: int,
        on_reclaim: OnReclaim,
        pools: Pools | None = None,
        durable_fillings: bool = True,
        ranking: Ranking = Ranking.SCAN_RESISTANT,
    ) -> None:
        """``durable_fillings``: a reclaimed region's old records count as on disk (for the
        tombstones that bury them) until a sync covers its new filling's first write, not only
        until that write lands; off where nothing is synced (``sync: none``). ``ranking``: which
        region eviction takes (adp_gateway/card/software/victims.py)."""
        assert region_bytes % PAGE_BYTES == 0
        databases = [Database(i, d, region_bytes) for i, d in enumerate(devices)]
        for db in databases:
            if len(db.regions) < 2:
                raise StartupError(
                    f"database {db.index} has room for {len(db.regions)} "
                    "region(s); it needs at least 2: raise `capacity` or lower "
                    "`region_size`"
                )
        self.region_bytes = region_bytes
        self._state = LogState(
            databases, on_reclaim, durable_fillings=durable_fillings, ranking=ranking
        )
        self._allocator = Allocator(self._state, pools or Pools())
        self._sealer = Sealer(self._state)
        self._writer = RecordWriter(self._state, self._allocator, self._sealer)
        self._reader = RecordReader(self._state)
        self.preparation = Preparation(self._state)
        self._preparer: Preparer | None = None

    @property
    def databases(self) -> int:
        return len(self._state.databases)

    @property
    def reclaims(self) -> int:
        return self._state.reclaims

    def eviction_age_s(self) -> float | None:
        """How long regions lately went unused before eviction; None if none was yet
        (adp_gateway/card/software/eviction_ages.py)."""
        return self._state.evictions.eviction_age_s(time.monotonic())

    @property
    def capacity_bytes(self) -> int:
        return sum(len(db.regions) * db.region_bytes for db in self._state.databases)

    @property
    def used_bytes(self) -> int:
        with self._state.lock:
            return sum(db.used_bytes() for db in self._state.databases)

    def salt(self, database: int) -> int:
        """The database's salt (its superblock's), which seeds its checksums."""
        return self._state.databases[database].salt

    def pool_bytes(self, tenant: str) -> tuple[int, int]:
        """The bytes of the regions held by ``tenant``'s pool, and the most it may hold."""
        return self._allocator.pool_bytes(tenant)

    def append(self, database: int, header: RecordHeader, payload: memoryview | None) -> Location:
        """Write one record; ``payload`` is page aligned, its length a multiple of 4 KiB."""
        return self.append_many(database, [(header, payload)])[0]

    def append_many(
        self, database: int, records: list[tuple[RecordHeader, memoryview | None]]
    ) -> list[Location]:
        """Write records to one database, placed one after another (records.py). Raises
        StorageError if any write failed."""
        return self._writer.append_many(database, records)

    def read_many(
        self, locations: list[Location], payloads: list[memoryview | None]
    ) -> list[RecordHeader | None]:
        """Read records of one database (records.py); an entry is None when that header is not
        valid any more. Raises StorageError if a read failed."""
        return self._reader.read_many(locations, payloads)

    def read(self, location: Location, payload: memoryview | None) -> RecordHeader | None:
        """Read the record at ``location``; None when its header is not valid any more."""
        return self.read_many([location], [payload])[0]

    def is_current(self, location: Location) -> bool:
        """Whether the region still holds the filling ``location`` was written in."""
        return self._state.is_current(location)

    def on_disk(self, location: Location) -> bool:
        """Whether a recovery might still find the record at ``location`` (regions.py)."""
        with self._state.lock:
            return self._state.on_disk(location)

    def retain(self, locations: tuple[Location, ...]) -> None:
        """The store uses these records: their regions are not empty."""
        count_live(self._state, locations, 1)

    def release(self, locations: tuple[Location, ...]) -> None:
        """The store no longer uses these records."""
        count_live(self._state, locations, -1)

    def sync(self, databases: set[int]) -> None:
        """Make every write completed so far on ``databases`` durable (group commit). Each
        database is synced even when another's sync fails; the first failure is raised then."""
        failed: StorageError | None = None
        for database in sorted(databases):
            try:
                self._state.databases[database].group_sync.sync()
            except OSError as exc:
                error = StorageError(f"sync of database {database} failed: {exc}")
                error.__cause__ = exc
                failed = failed or error
        if failed is not None:
            raise failed

    def close(self) -> None:
        """Seal the open regions with their footers (a restart treats every region as sealed,
        and reads a footer rather than walking), make everything durable, close the devices.
        Raises StorageError if the final sync fails."""
        if self._preparer is not None and not self._preparer.stop(PREPARER_STOP_WAIT_S):
            raise StorageError(
                f"the preparer's write has not returned in {PREPARER_STOP_WAIT_S:g} s: the "
                "databases are left open under it (the next start recovers them)"
            )
        for db in self._state.databases:
            self._sealer.seal_open(db)
        try:
            self.sync(set(range(self.databases)))
        finally:
            for db in self._state.databases:
                db.device.close()

    def scan(self, progress: Progress | None = None) -> Iterator[RegionRecords]:
        """Yield the records of every region in use (recovery.py); call once, before the first
        append."""
        return RegionScan(self._state, self._allocator.pools, self._sealer).scan(progress)

    def prepare_in_background(self, idle_s: float = 0.2) -> None:
        """Write the never-written blocks of free regions while the disk is idle
        (devices/preparer.py); ``close`` stops it."""
        self._preparer = Preparer(self.preparation, idle_s)
        self._preparer.start()
