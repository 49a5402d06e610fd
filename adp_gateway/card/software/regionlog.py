"""The software card: a log-structured region store, one per database (device).

Each device is ``[superblock 4 KiB][region 0][region 1]...``. Records (adp_gateway/format.py) are
appended to the database's one open region. A full region is sealed: once its last write has
landed, an index footer listing its records is written at its end (sealing.py), so a
restart reads one footer per region instead of every header.

When no region is free, a sealed region is reclaimed whole, in approximate-LRU order: regions
that hold nothing the store still uses go first, then the one least recently written or read.
``on_reclaim(database, region, epoch)`` tells the store to forget what the region held and
returns the records (tombstones) that must outlive it; they are rewritten at the start of the
region's next filling, before anything else lands there. The store reports which records it uses
with ``retain``/``release``.

Regions belong to pools. A tenant with a quota has a pool of its own, of at most its limit of
regions per database; when it is full, the tenant's next region is one of its own, reclaimed, so
no tenant ever evicts another's objects to make room. Every other tenant shares the pool ``""``
(all of the card when no tenant has a quota). A region's pool is named in its first record.

Every record carries its region's epoch (a new one for every filling), so a scan never believes
a record left from an older filling, and skips a hole left by a torn or failed write by looking
for the next header of the same epoch (recovery.py).

Every filling of a region starts with a header-only record naming its epoch (and then the
tombstones it carries). It travels in the region's first write, in front of that write's
records, so opening a region costs no I/O of its own and no lock is held across I/O. A record
in a region settles (counts as written, so it may be synced and acknowledged) only once that
first write has landed: a recovery always finds the epoch of any record it must find.

Thread-safety: ``append`` and ``read`` run concurrently from the I/O threads; space reservation
and region state are under the lock, the I/O never is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

from adp_gateway.card.software.devices.base import Device
from adp_gateway.card.software.devices.preparer import Preparer, base_device
from adp_gateway.card.software.recovery import (
    RegionReader,
    aligned,
    first_header,
    read_footer,
    walk,
    write_footer,
)
from adp_gateway.card.software.regions import (
    Database,
    Location,
    Pools,
    Region,
    RegionRecords,
    Run,
    header_pages,
    pack_run,
)
from adp_gateway.card.software.sealing import FooterRow, entry_bytes_max, row_of
from adp_gateway.errors import StartupError, StorageError
from adp_gateway.format import (
    HEADER_BYTES,
    Kind,
    RecordHeader,
    pack_header,
    unpack_header,
)
from adp_gateway.ring.layout import PAGE_BYTES, align_up

__all__ = ["Location", "OnReclaim", "Pools", "Progress", "RegionLog", "RegionRecords"]
log = logging.getLogger(__name__)
OnReclaim = Callable[[int, int, int], list[RecordHeader]]
Progress = Callable[[int, int], None]


class RegionLog:
    def __init__(
        self,
        devices: list[Device],
        region_bytes: int,
        on_reclaim: OnReclaim,
        pools: Pools | None = None,
    ) -> None:
        assert region_bytes % PAGE_BYTES == 0
        self._databases = [Database(i, d, region_bytes) for i, d in enumerate(devices)]
        for db in self._databases:
            if len(db.regions) < 2:
                raise StartupError(
                    f"database {db.index} has room for {len(db.regions)} "
                    "region(s); it needs at least 2: raise `capacity` or lower "
                    "`region_size`"
                )
        self.region_bytes = region_bytes
        self._on_reclaim = on_reclaim
        self._pools = pools or Pools()
        self._lock = threading.RLock()  # on_reclaim may call retain/release
        self._started = threading.Condition(self._lock)  # a region's first write is over
        self._next_epoch = 1
        self._clock = itertools.count(1)  # orders region accesses, for eviction
        self.reclaims = 0
        self._preparer: Preparer | None = None

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

    def pool_bytes(self, tenant: str) -> tuple[int, int]:
        """The bytes of the regions held by ``tenant``'s pool, and the most it may hold."""
        pool = self._pools.of(tenant)
        with self._lock:
            held = sum(
                self.region_bytes
                for db in self._databases
                for r in db.regions
                if r.epoch and r.pool == pool
            )
        limit = sum(self._pools.limit(pool, len(db.regions)) for db in self._databases)
        return held, limit * self.region_bytes

    def append(self, database: int, header: RecordHeader, payload: memoryview | None) -> Location:
        """Write one record; ``payload`` is page aligned, its length a multiple of 4 KiB."""
        return self.append_many(database, [(header, payload)])[0]

    def append_many(
        self, database: int, records: list[tuple[RecordHeader, memoryview | None]]
    ) -> list[Location]:
        """Write records to one database, placed one after another: each run that lands
        contiguously in one region goes to the device as one vectored write (a deep queue for
        the disk, as one large write is). Raises StorageError if any write failed."""
        db = self._databases[database]
        with self._busy(db):
            runs, to_seal = self._reserve(db, [header for header, _ in records])
            for region in to_seal:
                self._write_footer(db, region)
            landed, failure = self._write_runs(db, runs, [payload for _, payload in records])
            locations: list[Location] = []
            for run, written in zip(runs, landed, strict=True):
                locations += self._settle(db, run, written)
        if failure is not None:
            raise StorageError(f"write to database {database} failed: {failure}") from failure
        return locations

    def _write_runs(
        self, db: Database, runs: list[Run], payloads: list[memoryview | None]
    ) -> tuple[list[bool], OSError | None]:
        """Write each run; return which landed, and the first failure. A region's first run
        (the one carrying its prologue) goes first, and a run in a region whose first write is
        someone else's waits until that has landed: the region's first page must name the new
        filling before anything of it overwrites the old one, or a crash in between would leave
        the old filling's footer believed over records no longer there. Writes that lead a
        region never wait, so no thread waits for one that waits. After a failure the runs
        left are not written, but a region's prologue still is: others' records wait for it."""
        slices, first = [], 0
        for run in runs:
            slices.append(payloads[first : first + len(run.headers)])
            first += len(run.headers)
        landed = [False] * len(runs)
        failure: OSError | None = None
        order = sorted(range(len(runs)), key=lambda i: not runs[i].prologue)
        try:
            for i in order:
                run = runs[i]
                if not run.prologue and not self._wait_started(run.region):
                    continue  # its region's first write failed: nothing of it may be written
                packed = pack_run(db, run, slices[i]) if failure is None else []
                buffers = [*run.prologue, *packed]
                written = False
                if buffers:
                    try:
                        db.device.write(buffers, run.start)
                        db.group_sync.wrote()
                        written = True
                    except OSError as exc:
                        failure = failure or exc
                if run.prologue:
                    self._mark_started(db, run, written)
                    run.prologue = []
                landed[i] = written and bool(packed)
        finally:
            for run in runs:  # an unexpected error: no waiter may hang on a prologue left
                if run.prologue:
                    self._mark_started(db, run, False)
        return landed, failure

    def _wait_started(self, region: Region) -> bool:
        """Wait until the region's first write is over; whether it landed."""
        with self._lock:
            self._started.wait_for(lambda: region.started is not None)
            return bool(region.started)

    def _mark_started(self, db: Database, run: Run, landed: bool) -> None:
        """The region's first write is over. If it failed, the filling takes no more appends
        and nothing reserved in it settles as written (a recovery may not know its epoch)."""
        region = run.region
        with self._lock:
            region.started = landed
            if not landed:
                region.sealed = True
                if db.open.get(region.pool) is region:
                    del db.open[region.pool]
            self._started.notify_all()

    def read_many(
        self, locations: list[Location], payloads: list[memoryview | None]
    ) -> list[RecordHeader | None]:
        """Read records of one database (each header, and its payload into ``payloads[i]``);
        records that lie back to back are read with one vectored read. An entry is None when
        that header is not valid any more; all are None, without I/O, when a region was reclaimed
        since the locations were looked up. Raises StorageError if a read failed."""
        db = self._databases[locations[0].database]
        regions = {location.region for location in locations}
        with self._lock:
            if not all(map(self.is_current, locations)):
                return [None] * len(locations)
            for region in regions:
                db.regions[region].reads_inflight += 1
            db.busy += 1
        try:
            return self._read_records(db, locations, payloads)
        finally:
            with self._lock:
                for region in regions:
                    db.regions[region].reads_inflight -= 1
                db.busy -= 1
                db.last_io = time.monotonic()

    def _read_records(
        self, db: Database, locations: list[Location], payloads: list[memoryview | None]
    ) -> list[RecordHeader | None]:
        pages = header_pages.take(len(locations))
        views = [pages[i * HEADER_BYTES : (i + 1) * HEADER_BYTES] for i in range(len(locations))]
        first = 0
        while first < len(locations):
            last = first
            while (
                last + 1 < len(locations)
                and locations[last].offset + locations[last].record_bytes
                == locations[last + 1].offset
            ):
                last += 1
            buffers = []
            for i in range(first, last + 1):
                payload = payloads[i]
                buffers += [views[i]] if payload is None else [views[i], payload]
            try:
                db.device.read(buffers, locations[first].offset)
            except OSError as exc:
                raise StorageError(f"read from database {db.index} failed: {exc}") from exc
            first = last + 1
        headers: list[RecordHeader | None] = []
        for location, page in zip(locations, views, strict=True):
            header = unpack_header(page, db.salt)
            if header is None or header.epoch != location.epoch:
                headers.append(None)
                continue
            region = db.regions[location.region]
            if region.epoch == location.epoch:
                region.last_access = next(self._clock)
            headers.append(header)
        return headers

    def read(self, location: Location, payload: memoryview | None) -> RecordHeader | None:
        """Read the record at ``location``; None when its header is not valid any more."""
        return self.read_many([location], [payload])[0]

    def is_current(self, location: Location) -> bool:
        """Whether the region still holds the filling ``location`` was written in."""
        return self._databases[location.database].regions[location.region].epoch == location.epoch

    def retain(self, locations: tuple[Location, ...]) -> None:
        """The store uses these records: their regions are not empty."""
        self._count_live(locations, 1)

    def release(self, locations: tuple[Location, ...]) -> None:
        """The store no longer uses these records."""
        self._count_live(locations, -1)

    def sync(self, databases: set[int]) -> None:
        """Make every write completed so far on ``databases`` durable (group commit)."""
        for database in databases:
            try:
                self._databases[database].group_sync.sync()
            except OSError as exc:
                raise StorageError(f"sync of database {database} failed: {exc}") from exc

    def close(self) -> None:
        """Seal the open regions with their footers (a restart treats every region as sealed,
        and reads a footer rather than walking), make everything durable, close the devices.
        Raises StorageError if the final sync fails."""
        if self._preparer is not None:
            self._preparer.stop()
        for db in self._databases:
            with self._lock:
                ready = []
                for region in db.open.values():
                    region.sealed = True
                    if self._ready_to_seal(region):
                        ready.append(region)
                db.open.clear()
            for region in ready:
                self._write_footer(db, region)
        try:
            self.sync(set(range(self.databases)))
        finally:
            for db in self._databases:
                db.device.close()

    def scan(self, progress: Progress | None = None) -> Iterator[RegionRecords]:
        """Yield the records of every region in use; call once, before the first append.

        A region with a valid footer is read from it; any other is walked header by header,
        and gets its footer written then, so the next restart is fast.
        """
        total = sum(len(db.regions) for db in self._databases)
        done = 0
        for db in self._databases:
            for region in db.regions:
                rows = self._recover_region(db, region)
                if rows:
                    start = db.region_offset(region.index)
                    yield RegionRecords(db.index, region.index, region.epoch, start, rows)
                done += 1
                if progress is not None:
                    progress(done, total)
        regions = [r for db in self._databases for r in db.regions]
        top = max((r.epoch for r in regions), default=0)
        self._next_epoch = top + 1
        self._clock = itertools.count(top + 1)

    def _recover_region(self, db: Database, region: Region) -> list[FooterRow]:
        reader = RegionReader(db.device, db.region_offset(region.index), db.region_bytes)
        first = first_header(reader, db.salt)
        if first is None:
            return []
        region.epoch = region.last_access = first.epoch
        region.pool = self._pools.of(first.tenant)  # a quota since removed: the shared pool
        region.sealed = True
        rows = read_footer(reader, db.salt, first.epoch)
        if rows:
            region.used_bytes = rows[-1][0] + HEADER_BYTES + align_up(rows[-1][7])
            return rows

        def hole(at: int, resumed: int) -> None:
            log.warning(
                "database %d region %d: skipped damaged bytes %d..%d",
                db.index,
                region.index,
                at,
                resumed,
            )

        records = [r for r in walk(reader, db.salt, first.epoch, hole) if r[1].kind != Kind.REGION]
        region.records = records
        if records:
            region.used_bytes = records[-1][0] + records[-1][1].record_bytes
            region.writes_inflight += 1
            self._write_footer(db, region)
        return [row_of(offset, header) for offset, header in records]

    def _reserve(self, db: Database, headers: list[RecordHeader]) -> tuple[list[Run], list[Region]]:
        """Room for records, one after another: the runs to write (each contiguous in one
        region, headers stamped with its epoch) and the regions just sealed, whose footers the
        caller writes."""
        for header in headers:
            if not Region(0).fits(header, db.region_bytes):
                raise StorageError(
                    f"a record of {header.record_bytes} bytes and its footer entry do not fit "
                    f"a region of {db.region_bytes}: raise `region_size` above `fragment_size`"
                )
        runs: list[Run] = []
        to_seal = []
        pool = self._pools.of(headers[0].tenant)
        with self._lock:
            for header in headers:
                assert self._pools.of(header.tenant) == pool
                region = db.open.get(pool)
                if region is None or not region.fits(header, db.region_bytes):
                    if region is not None:
                        region.sealed = True
                        del db.open[pool]
                        if self._ready_to_seal(region):
                            to_seal.append(region)
                    region = db.open[pool] = self._take_region(db, pool)
                offset = db.region_offset(region.index) + region.used_bytes
                if not runs or runs[-1].region is not region:
                    runs.append(Run(region, offset, []))
                    if region.prologue is not None:
                        runs[-1].prologue, region.prologue = region.prologue, None
                runs[-1].headers.append(dataclasses.replace(header, epoch=region.epoch))
                region.used_bytes += header.record_bytes
                region.footer_bytes += entry_bytes_max(header)
                region.writes_inflight += 1
        return runs, to_seal

    def _settle(self, db: Database, run: Run, written: bool) -> list[Location]:
        """A run's writes are over: record them for the footer, seal the region if due. A run
        counts as written only once its region's first write has landed."""
        region = run.region
        locations = []
        with self._lock:
            self._started.wait_for(lambda: region.started is not None)
            written = written and bool(region.started)
            start = run.offset - db.region_offset(region.index)
            for header in run.headers:
                if written:
                    region.records.append((start, header))
                locations.append(db.location(region, start, header))
                start += header.record_bytes
            region.writes_inflight -= len(run.headers)
            if region.started is False and region.writes_inflight == 0:
                self._free_failed(region)
            seal = self._ready_to_seal(region)
        if seal:
            self._write_footer(db, region)
        return locations

    def _free_failed(self, region: Region) -> None:
        """Under the lock: a filling whose first write failed, with nothing in flight, is free
        again; the tombstones it was to carry go to its next filling."""
        carried = [header for _, header in region.records if header.kind == Kind.TOMBSTONE]
        region.refill(0, 0, Pools.SHARED)
        region.started, region.carried = True, carried

    def _ready_to_seal(self, region: Region) -> bool:
        """Under the lock: whether the footer is due now; if so the caller writes it."""
        if region.sealed and region.writes_inflight == 0 and region.records:
            region.writes_inflight += 1  # the footer write: no reclaim meanwhile
            return True
        return False

    def _write_footer(self, db: Database, region: Region) -> None:
        """Write ``region``'s footer and trailer (counted in its writes_inflight)."""
        try:
            with self._lock:
                records = list(region.records)
                epoch = region.epoch
            reader = RegionReader(db.device, db.region_offset(region.index), db.region_bytes)
            if write_footer(reader, db.salt, epoch, records):
                db.group_sync.wrote()
            else:
                log.warning("database %d region %d: no room for its footer", db.index, region.index)
        except OSError as exc:
            log.error("database %d region %d: footer not written: %s", db.index, region.index, exc)
        finally:
            with self._lock:
                region.writes_inflight -= 1

    def prepare_in_background(self, idle_s: float = 0.2) -> None:
        """Write the never-written blocks of free regions while the disk is idle
        (devices/preparer.py); ``close`` stops it."""
        self._preparer = Preparer(self, idle_s)
        self._preparer.start()

    def unprepared_regions(self) -> int:
        with self._lock:
            return sum(
                1
                for db in self._databases
                for r in db.regions
                if r.epoch == 0 and r.prepared_bytes < db.region_bytes
            )

    def claim_unprepared(self, idle_s: float) -> tuple[int, int, int, int] | None:
        with self._lock:
            for db in self._databases:
                if not db.idle(idle_s):
                    continue
                free = [r for r in db.regions if r.epoch == 0 and not r.preparing]
                todo = [r for r in free if r.prepared_bytes < db.region_bytes]
                # Leave two free regions to the log, so it never waits for one held here.
                if not todo or len(free) < 3:
                    continue
                region = todo[0]
                region.preparing = True
                db.takes_seen = db.takes
                start = db.region_offset(region.index)
                end = start + db.region_bytes
                return db.index, region.index, start + region.prepared_bytes, end
        return None

    def write_zeros(self, database: int, zeros: memoryview, offset: int) -> None:
        base_device(self._databases[database].device).write([zeros], offset)

    def prepared(self, database: int, region: int, upto: int, idle_s: float) -> bool:
        db = self._databases[database]
        with self._lock:
            held = db.regions[region]
            held.prepared_bytes = upto - db.region_offset(region)
            room = True
            if db.takes != db.takes_seen:  # regions were taken since: count the free ones
                db.takes_seen = db.takes
                room = sum(1 for r in db.regions if r.epoch == 0 and not r.preparing) >= 2
            if held.prepared_bytes < db.region_bytes and room and db.idle(idle_s):
                return True
            held.preparing = False
            return False

    def give_back(self, database: int, region: int, upto: int) -> None:
        db = self._databases[database]
        with self._lock:
            held = db.regions[region]
            held.prepared_bytes = upto - db.region_offset(region)
            held.preparing = False

    @contextlib.contextmanager
    def _busy(self, db: Database) -> Iterator[None]:
        """An append is in progress on ``db`` (the preparer waits for the disk to be idle)."""
        with self._lock:
            db.busy += 1
        try:
            yield
        finally:
            with self._lock:
                db.busy -= 1
                db.last_io = time.monotonic()

    def _count_live(self, locations: tuple[Location, ...], delta: int) -> None:
        with self._lock:
            for location in locations:
                region = self._databases[location.database].regions[location.region]
                if region.epoch == location.epoch:
                    region.live += delta

    def _take_region(self, db: Database, pool: str) -> Region:
        """A region for ``pool`` to open (under the lock): a free one while the pool is below
        its limit, else the best of its own to reclaim (or of a pool over its limit, as a
        lowered quota leaves)."""
        carried: list[RecordHeader] = []
        db.takes += 1
        held = Counter(r.pool for r in db.regions if r.epoch)
        free = [r for r in db.regions if r.epoch == 0 and not r.preparing]
        below = held[pool] < self._pools.limit(pool, len(db.regions))
        if free and below:  # written-once regions first, then in order
            region = min(free, key=lambda r: (r.prepared_bytes < db.region_bytes, r.index))
            carried = region.carried
        else:
            over = {p for p, n in held.items() if n > self._pools.limit(p, len(db.regions))}
            victims = over if below else {pool}
            opened = set(map(id, db.open.values()))
            idle = [
                r
                for r in db.regions
                if r.epoch
                and r.pool in victims
                and r.writes_inflight == r.reads_inflight == 0
                and id(r) not in opened
            ]
            if not idle:
                raise StorageError(
                    f"database {db.index} has no region to reclaim for "
                    f"{'tenant ' + repr(pool) if pool else 'the shared pool'}; every one it "
                    "may take has reads or writes in flight"
                )
            region = min(idle, key=lambda r: (r.live > 0, r.last_access))
            carried = self._on_reclaim(db.index, region.index, region.epoch)
            self.reclaims += 1
        region.refill(self._next_epoch, next(self._clock), pool)
        self._next_epoch += 1
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
            if not region.fits(record, db.region_bytes):
                log.error("database %d: %d tombstones not carried", db.index, len(carried))
                break
            page = aligned(HEADER_BYTES)
            pack_header(record, page, db.salt)
            pages.append(page)
            if record is not start:
                region.records.append((region.used_bytes, record))
                region.footer_bytes += entry_bytes_max(record)
            region.used_bytes += HEADER_BYTES
        return pages
