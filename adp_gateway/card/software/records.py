"""Record I/O on the software card: appending records to a database's open region, and reading
them back.

Records (adp_gateway/card/software/format.py) are appended to the pool's open region. Space is
reserved under the lock, and the I/O never is: ``append_many`` and ``read_many`` run
concurrently from the I/O threads. Every filling of a region starts with its prologue
(pools.py), which travels in the region's first write; a record in a region settles (counts as
written, so it may be synced and acknowledged) only once that first write has landed, so a
recovery always finds the epoch of any record it must find.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import threading
import time
from collections.abc import Iterator

from adp_gateway.card.software.devices.reader import aligned
from adp_gateway.card.software.format import (
    HEADER_BYTES,
    Kind,
    RecordHeader,
    pack_header,
    unpack_header,
)
from adp_gateway.card.software.pools import Allocator
from adp_gateway.card.software.regions import (
    Database,
    Location,
    LogState,
    Region,
    Run,
)
from adp_gateway.card.software.sealing import Sealer, entry_bytes_max, fits
from adp_gateway.errors import StorageError
from adp_wire.ring.layout import align_up

# How long an append waits for another thread's first write of its region (which a disk that
# does not answer can hold for ever): past it, its own records are not written and it fails.
# The op's client has given up by then (op_timeout_s, 10 s by default).
FIRST_WRITE_WAIT_S = 10.0


class RecordWriter:
    """Appends records; a region filled by them is sealed (sealing.py)."""

    def __init__(self, state: LogState, allocator: Allocator, sealer: Sealer) -> None:
        self._state = state
        self._allocator = allocator
        self._sealer = sealer

    def append_many(
        self, database: int, records: list[tuple[RecordHeader, memoryview | None]]
    ) -> list[Location]:
        """Write records to one database, placed one after another: each run that lands
        contiguously in one region goes to the device as one vectored write (a deep queue for
        the disk, as one large write is). Raises StorageError if any write failed."""
        db = self._state.databases[database]
        with self._busy(db):
            runs, to_seal = self._reserve(db, [header for header, _ in records])
            for region in to_seal:
                self._sealer.write(db, region)
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
                    # Its region's first write failed, or has not landed in time: nothing of
                    # the region may be written, and this append fails (never acknowledged).
                    failure = failure or OSError(
                        errno.EIO,
                        f"its region's first write failed or did not land in "
                        f"{FIRST_WRITE_WAIT_S:g} s",
                    )
                    continue
                packed = pack_run(db, run, slices[i]) if failure is None else []
                buffers = [*run.prologue, *packed]
                ticket = 0  # the write's, in the group sync; 0: it did not land
                if buffers:
                    try:
                        db.device.write(buffers, run.start)
                        ticket = db.group_sync.wrote()
                    except OSError as exc:
                        failure = failure or exc
                written = ticket > 0
                if run.prologue:
                    self._mark_started(db, run, ticket)
                    run.prologue = []
                landed[i] = written and bool(packed)
        finally:
            for run in runs:  # an unexpected error: no waiter may hang on a prologue left
                if run.prologue:
                    self._mark_started(db, run, 0)
        return landed, failure

    def _wait_started(self, region: Region) -> bool:
        """Wait until the region's first write is over (at most FIRST_WRITE_WAIT_S); whether
        it landed."""
        with self._state.lock:
            self._first_write_over(region)
            return bool(region.started)

    def _first_write_over(self, region: Region) -> None:
        """Under the lock: wait until the region's first write is over, at most
        FIRST_WRITE_WAIT_S (``region.started`` is still None after that)."""
        self._state.started.wait_for(lambda: region.started is not None, FIRST_WRITE_WAIT_S)

    def _mark_started(self, db: Database, run: Run, ticket: int) -> None:
        """The region's first write is over (``ticket``: its write in the group sync, 0 if it
        failed). If it failed, the filling takes no more appends and nothing reserved in it
        settles as written (a recovery may not know its epoch)."""
        region = run.region
        with self._state.lock:
            region.started = ticket > 0
            if ticket:
                self._state.first_write_landed(db, region, ticket)
            else:
                region.sealed = True
                if db.open.get(region.pool) is region:
                    del db.open[region.pool]
            self._state.started.notify_all()

    def _reserve(self, db: Database, headers: list[RecordHeader]) -> tuple[list[Run], list[Region]]:
        """Room for records, one after another: the runs to write (each contiguous in one
        region, headers stamped with its epoch) and the regions just sealed, whose footers the
        caller writes."""
        for header in headers:
            if not fits(Region(0), header, db.region_bytes):
                raise StorageError(
                    f"a record of {header.record_bytes} bytes and its footer entry do not fit "
                    f"a region of {db.region_bytes}: raise `region_size` above `fragment_size`"
                )
        runs: list[Run] = []
        to_seal = []
        pool = self._allocator.pools.of(headers[0].tenant)
        with self._state.lock:
            for header in headers:
                assert self._allocator.pools.of(header.tenant) == pool
                region = db.open.get(pool)
                if region is None or not fits(region, header, db.region_bytes):
                    if region is not None:
                        region.sealed = True
                        del db.open[pool]
                        if self._sealer.ready(region):
                            to_seal.append(region)
                    region = db.open[pool] = self._allocator.take(db, pool)
                offset = db.region_offset(region.index) + region.used_bytes
                if not runs or runs[-1].region is not region:
                    runs.append(Run(region, offset, []))
                    if region.prologue is not None:
                        runs[-1].prologue, region.prologue = region.prologue, None
                runs[-1].headers.append(dataclasses.replace(header, epoch=region.epoch))
                db.reserve(region, header.record_bytes)
                region.footer_bytes += entry_bytes_max(header)
                region.writes_inflight += 1
        return runs, to_seal

    def _settle(self, db: Database, run: Run, written: bool) -> list[Location]:
        """A run's writes are over: record them for the footer, seal the region if due. A run
        counts as written only once its region's first write has landed."""
        region = run.region
        locations = []
        with self._state.lock:
            self._first_write_over(region)
            written = written and bool(region.started)
            start = run.offset - db.region_offset(region.index)
            for header in run.headers:
                if written:
                    region.records.append((start, header))
                locations.append(db.location(region, start, header))
                start += header.record_bytes
            region.writes_inflight -= len(run.headers)
            if region.started is False and region.writes_inflight == 0:
                self._free_failed(db, region)
            seal = self._sealer.ready(region)
        if seal:
            self._sealer.write(db, region)
        return locations

    def _free_failed(self, db: Database, region: Region) -> None:
        """Under the lock: a filling whose first write failed, with nothing in flight, is free
        again; the tombstones it was to carry go to its next filling."""
        carried = [header for _, header in region.records if header.kind == Kind.TOMBSTONE]
        db.release(region)
        region.started, region.carried = True, carried

    @contextlib.contextmanager
    def _busy(self, db: Database) -> Iterator[None]:
        """An append is in progress on ``db`` (the preparer waits for the disk to be idle)."""
        with self._state.lock:
            db.busy += 1
        try:
            yield
        finally:
            with self._state.lock:
                db.busy -= 1
                db.last_io = time.monotonic()


# Records in one vectored read: two buffers each, well inside the kernel's IOV_MAX (1024).
RUN_RECORDS_MAX = 256


class RecordReader:
    """Reads records back, header and payload, in vectored reads."""

    def __init__(self, state: LogState) -> None:
        self._state = state

    def read_many(
        self, locations: list[Location], payloads: list[memoryview | None]
    ) -> list[RecordHeader | None]:
        """Read records of one database (each header, and its payload into ``payloads[i]``);
        records that lie back to back are read with one vectored read. An entry is None when
        that header is not valid any more, without I/O when its region was reclaimed since the
        locations were looked up. Raises StorageError if a read failed."""
        db = self._state.databases[locations[0].database]
        with self._state.lock:
            current = [i for i, at in enumerate(locations) if self._state.is_current(at)]
            regions = {locations[i].region for i in current}
            for region in regions:
                db.regions[region].reads_inflight += 1
            db.busy += 1
        read: set[int] = set()  # the regions a valid record was read from
        try:
            headers: list[RecordHeader | None] = [None] * len(locations)
            found = self._read_records(
                db, [locations[i] for i in current], [payloads[i] for i in current]
            )
            for i, header in zip(current, found, strict=True):
                headers[i] = header
                if header is not None:
                    read.add(locations[i].region)
            return headers
        finally:
            with self._state.lock:
                for region in regions:
                    db.regions[region].reads_inflight -= 1
                for region in read:  # each once: a move in the eviction order costs ~20 us
                    db.touch(db.regions[region], next(self._state.clock))
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
                and last + 1 - first < RUN_RECORDS_MAX
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
            headers.append(header)
        return headers


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
