"""Recovery of the software card, all in one place: reading each region back without trusting
anything (its footer, or a walk of its headers), then rebuilding the values from its records.

``read_footer`` returns what a sealed region's footer lists (sealing.py), or None. A ``walk``
goes header by header from the region's start, through a 1 MiB read-ahead window so that small
records cost one read per MiB, not one per record. It stops believing at a header that is
invalid or of another epoch, and looks forward page by page for the next header of the same
epoch (a torn or failed write leaves such a hole); each hole is reported to ``on_hole``.

Every record carries its region's epoch (a new one for every filling), so a scan never believes
a record left from an older filling. A walk also checks each record's payload, one read of the
region with its headers: a region without a footer was being written when the gateway stopped,
and a write cut short can leave a valid header before a torn payload. A region walked gets its
footer written then, so the next restart is fast.

``recover_values`` turns the records into the index: the newest complete version of each
value wins (a value is one record, or several of the layout before the fragment-level card),
unless a newer tombstone deletes it; a tombstone that still shadows a record on
disk is kept (tombstones.py), so it is carried when its region is reclaimed.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple, Never

from tqdm import tqdm

from adp_gateway.card.software.devices.reader import RegionReader, aligned
from adp_gateway.card.software.format import (
    HEADER_BYTES,
    RECORD_MAGIC,
    Kind,
    RecordHeader,
    Superblock,
    pack_region_start,
    unpack_header,
)
from adp_gateway.card.software.index import Index, Manifest, ValueId
from adp_gateway.card.software.pools import Pools
from adp_gateway.card.software.regions import Database, Location, LogState, Region
from adp_gateway.card.software.sealing import (
    TRAILER_BYTES,
    FooterRow,
    Sealer,
    row_of,
    unpack_footer,
    unpack_trailer,
)
from adp_gateway.card.software.tombstones import Tombstones
from adp_wire.checksum import checksum
from adp_wire.ring.layout import PAGE_BYTES, align_up

log = logging.getLogger(__name__)
Progress = Callable[[int, int], None]
Buried = tuple[ValueId, int, Location, list[Location]]  # a tombstone: seq, where, what it shadows


class RegionRecords(NamedTuple):
    """What a recovery found in one region: its records as footer rows (sealing.py)."""

    database: int
    region: int
    epoch: int
    start: int  # the region's offset on the device; a row's record is at start + row[0]
    rows: list[FooterRow]


class Recovered(NamedTuple):
    values: dict[str, dict[str, Manifest]]  # namespace -> name -> newest live version
    tombstones: list[Buried]
    top_seq: int


class RegionScan:
    """Reads every region of the log back at start-up (before the first append)."""

    def __init__(self, state: LogState, pools: Pools, sealer: Sealer) -> None:
        self._state = state
        self._pools = pools
        self._sealer = sealer

    def scan(self, progress: Progress | None = None) -> Iterator[RegionRecords]:
        """Yield the records of every region in use; call once, before the first append.

        A region with a valid footer is read from it; any other is walked header by header,
        and gets its footer written then, so the next restart is fast.
        """
        total = sum(len(db.regions) for db in self._state.databases)
        done = 0
        for db in self._state.databases:
            for region in db.regions:
                try:
                    rows = self._recover_region(db, region)
                except OSError as exc:
                    rows = self._unreadable(db, region, exc)
                if rows:
                    start = db.region_offset(region.index)
                    yield RegionRecords(db.index, region.index, region.epoch, start, rows)
                done += 1
                if progress is not None:
                    progress(done, total)
        regions = [r for db in self._state.databases for r in db.regions]
        top = max((r.epoch for r in regions), default=0)
        # Epochs never come back, not even those of fillings whose start record a power cut
        # lost while later writes of theirs landed: a region refilled under such an epoch would
        # have a walk believe those stale records. The wall clock in nanoseconds is past every
        # epoch an earlier run handed out (one a filling), as long as it is not set back.
        self._state.next_epoch = max(top + 1, time.time_ns())
        self._state.clock = itertools.count(top + 1)
        for db in self._state.databases:
            db.held = None  # the take after recovery counts the regions again

    def _recover_region(self, db: Database, region: Region) -> list[FooterRow]:
        reader = RegionReader(
            db.device, db.region_offset(region.index), db.region_bytes, zero_unreadable=True
        )
        first = first_header(reader, db.salt)
        repair = first is None and (any(reader.page(0, read_ahead=False)) or 0 in reader.unreadable)
        if repair:  # not free: its start record is damaged, and its records may not be
            first = self._damaged_start(db, region, reader)
        if first is None:
            return []
        # Last used, as far as the ranking knows, in the order of their fillings.
        region.epoch = region.disk_epoch = region.last_access = first.epoch
        region.pool = self._pools.of(first.tenant)  # a quota since removed: the shared pool
        region.sealed = True
        rows = read_footer(reader, db.salt, first.epoch)
        if rows:
            region.used_bytes = rows[-1][0] + HEADER_BYTES + align_up(rows[-1][7])
        else:
            rows = self._walk(db, region, reader, first)
        if repair:
            rewrite_start(reader, db.superblock, first)
            db.group_sync.wrote()
        if reader.unreadable:
            log.warning(
                "database %d region %d: %d page(s) could not be read at start-up (the first at "
                "byte %d of the region); the records in them are lost, its others kept",
                db.index,
                region.index,
                len(reader.unreadable),
                reader.unreadable[0],
            )
        return rows

    @staticmethod
    def _unreadable(db: Database, region: Region, exc: OSError) -> list[FooterRow]:
        """A region the device failed at start-up (a write back of its start record or of an
        invalidated header; a page it cannot read only reads as zeros): its records are not
        loaded, and the region is reclaimed first, as one emptied; the rest of the database
        starts as it is."""
        log.warning(
            "database %d region %d: the device failed at start-up (%s); its records are not "
            "loaded, and the region is reused first",
            db.index,
            region.index,
            exc,
        )
        region.records, region.writes_inflight = [], 0
        return []

    def _damaged_start(
        self, db: Database, region: Region, reader: RegionReader
    ) -> RecordHeader | None:
        """The start record a region whose first page is damaged had: its filling's epoch and
        pool, from the records and trailer in it that still verify (a flipped byte in that
        page must not cost the records behind it). None when nothing in it verifies."""
        filling = damaged_filling(reader, db.salt)
        if filling is None:
            log.warning(
                "database %d region %d: its start record is damaged and nothing in it "
                "verifies; the region is reused",
                db.index,
                region.index,
            )
            return None
        pools = {self._pools.of(tenant) for tenant in filling.tenants}
        pool = pools.pop() if len(pools) == 1 else self._pools.SHARED
        log.warning(
            "database %d region %d: its start record is damaged; its records (filling %d) are "
            "read from its footer or by a walk, and the start record is rewritten",
            db.index,
            region.index,
            filling.epoch,
        )
        return RecordHeader(Kind.REGION, 0, pool, "", 0, epoch=filling.epoch)

    def _walk(
        self, db: Database, region: Region, reader: RegionReader, first: RecordHeader
    ) -> list[FooterRow]:
        """The records of a region without a valid footer, header by header; its footer is
        written then."""

        def hole(at: int, resumed: int) -> None:
            log.warning(
                "database %d region %d: skipped damaged bytes %d..%d",
                db.index,
                region.index,
                at,
                resumed,
            )

        records: list[tuple[int, RecordHeader]] = []
        end = 0  # of the last record walked, believed or not
        for offset, header in walk(reader, db.salt, first.epoch, hole):
            if header.kind == Kind.REGION:
                continue
            end = offset + header.record_bytes
            if self._believed(db, reader, offset, header):
                records.append((offset, header))
        region.records = records
        region.used_bytes = end
        if records:  # else nothing to index, and a footer at 0 would cover the start record
            region.writes_inflight += 1
            self._sealer.write(db, region)
        return [row_of(offset, header) for offset, header in records]

    @staticmethod
    def _believed(db: Database, reader: RegionReader, offset: int, header: RecordHeader) -> bool:
        """Whether a walked record holds the payload its header promises. A region without a
        footer was being written when the gateway stopped, and a write cut short (a SIGKILL
        while the kernel pins its source pages, a power cut) can leave a valid header before a
        torn payload. Such a record is invalidated on disk (its header zeroed, as
        ``adp-gateway check --fix`` does), so neither a recovery nor a check believes it. A
        record the device could not read is only left out: a read error is not damage."""
        if header.kind != Kind.DATA or payload_intact(reader, offset, header):
            return True
        if any(offset <= page < offset + header.record_bytes for page in reader.unreadable):
            return False  # logged with the region's unreadable pages
        log.warning(
            "database %d: the record of %s/%s at %d was torn by a crash (its payload fails its "
            "checksum); dropped",
            db.index,
            header.tenant,
            header.key,
            reader.start + offset,
        )
        invalidate(reader, offset)
        return False


def rebuild(
    found_regions: Iterable[RegionRecords],
    index: Index,
    tombstones: Tombstones,
    retain: Callable[[tuple[Location, ...]], None],
) -> int:
    """Load what ``found_regions`` (a scan) hold into the empty ``index`` and ``tombstones``,
    tell the log which records are in use (``retain``); return the highest sequence number."""
    found = recover_values(found_regions)
    for value_id, seq, at, shadowed in found.tombstones:
        tombstones.add(value_id, seq, at, shadowed)
    index.load(found.values)
    values = found.values.values()
    retain(tuple(loc for names in values for m in names.values() for loc in m.locations))
    return found.top_seq


def recover_values(found_regions: Iterable[RegionRecords]) -> Recovered:
    """The values ``found`` (a scan's regions) hold: the index, the tombstones that still
    shadow records, and the highest sequence number.

    The newest complete version of each value wins, unless a newer tombstone deletes it.
    Written for speed (100,000 values in well under a second): it works on footer rows
    and builds a Location and a Manifest only per record, nothing more.
    """
    best: dict[str, dict[str, Manifest]] = defaultdict(dict)  # tenant -> key -> newest
    older: dict[ValueId, list[Manifest]] = defaultdict(list)  # complete, superseded
    fragmented: dict[tuple[ValueId, int], dict[int, _Fragment]] = defaultdict(dict)
    tombstones: dict[ValueId, tuple[int, Location]] = {}
    top_seq = 0
    new = tuple.__new__  # what a NamedTuple's constructor calls, without its Python frame
    for found in found_regions:
        database, region, epoch, start = found.database, found.region, found.epoch, found.start
        for offset, kind, seq, tenant, key, size, at, length, index, count, _ in found.rows:
            if seq > top_seq:
                top_seq = seq
            record_bytes = HEADER_BYTES + ((length + PAGE_BYTES - 1) & -PAGE_BYTES)
            location = new(Location, (database, region, epoch, start + offset, record_bytes))
            if kind == _DATA and count == 1:  # the common case, kept lean
                manifest = new(Manifest, (seq, size, size or 1, (location,)))
                objects = best[tenant]
                current = objects.setdefault(key, manifest)
                if current is not manifest:
                    _offer(objects, older, (tenant, key), manifest)
            elif kind == _DATA:
                fragmented[((tenant, key), seq)][index] = (location, size, at, length, count)
            elif kind == _TOMBSTONE and tombstones.get((tenant, key), (0,))[0] < seq:
                tombstones[(tenant, key)] = (seq, location)
    for (value_id, seq), fragments in fragmented.items():
        assembled = _assemble(seq, fragments)
        if assembled is not None:
            objects = best[value_id[0]]
            if objects.setdefault(value_id[1], assembled) is not assembled:
                _offer(objects, older, value_id, assembled)
    buried: list[Buried] = []
    for value_id, (seq, tombstone_at) in tombstones.items():
        shadowed = [loc for m in older.get(value_id, ()) if m.seq < seq for loc in m.locations]
        objects = best[value_id[0]]
        newest = objects.get(value_id[1])
        if newest is not None and newest.seq < seq:
            shadowed.extend(newest.locations)
            del objects[value_id[1]]
        if shadowed:
            buried.append((value_id, seq, tombstone_at, shadowed))
    return Recovered(best, buried, top_seq)


class Filling(NamedTuple):
    """What a region whose start record is damaged still says of its filling."""

    epoch: int
    tenants: frozenset[str]  # of its data records


def damaged_filling(reader: RegionReader, salt: int) -> Filling | None:
    """The filling of a region whose first page holds no valid start record: the newest epoch
    any header or trailer in it verifies with (a region's current filling is its newest), and
    the tenants of that filling's data records; None when nothing in it verifies. Reads the
    whole region once: it is only for a region whose first page was damaged."""
    epoch = 0
    tenants: set[str] = set()
    limit = reader.region_bytes - TRAILER_BYTES
    for offset in range(PAGE_BYTES, limit, PAGE_BYTES):
        page = reader.page(offset)
        if page[:8] != RECORD_MAGIC:
            continue
        header = unpack_header(page, salt)
        if header is None or header.epoch < epoch:
            continue
        if header.epoch > epoch:
            epoch, tenants = header.epoch, set()
        if header.kind == Kind.DATA:
            tenants.add(header.tenant)
    trailer = unpack_trailer(reader.page(limit, read_ahead=False), salt)
    if trailer is not None and trailer.epoch > epoch:
        epoch, tenants = trailer.epoch, set()
    return Filling(epoch, frozenset(tenants)) if epoch else None


def rewrite_start(reader: RegionReader, superblock: Superblock, start: RecordHeader) -> None:
    """Write a region's start record again (its first page was damaged), so the next start
    and `adp-gateway check` read the region as any other."""
    page = aligned(HEADER_BYTES)
    pack_region_start(start, superblock, page, superblock.salt)
    reader.device.write([page], reader.start)


def first_header(reader: RegionReader, salt: int) -> RecordHeader | None:
    """The header of the region's first record, which gives its epoch; None: a free region."""
    return unpack_header(reader.page(0, read_ahead=False), salt)


def payload_intact(reader: RegionReader, offset: int, header: RecordHeader) -> bool:
    """Whether the payload of the record at ``offset`` matches its header's checksum."""
    payload = reader.span(offset + HEADER_BYTES, align_up(header.fragment_bytes))
    return checksum(payload[: header.fragment_bytes]) == header.payload_checksum


def invalidate(reader: RegionReader, offset: int) -> None:
    """Zero the header of the record at ``offset``, so no recovery or check believes it again."""
    reader.device.write([aligned(HEADER_BYTES)], reader.start + offset)


def read_footer(reader: RegionReader, salt: int, epoch: int) -> list[FooterRow]:
    """The rows a valid footer of this epoch lists; [] when there is none."""
    return inspect_footer(reader, salt, epoch)[0]


def inspect_footer(
    reader: RegionReader, salt: int, epoch: int
) -> tuple[list[FooterRow], str | None]:
    """The rows a valid footer of this epoch lists ([] when there is none), and what is wrong
    with the region's trailer or footer: None when it has a valid one, or none at all (its
    last page zeros, or a trailer of an older filling: a region filled when the gateway
    stopped). A format zeroes every region's last page, and records never reach it, so any
    other bytes there are damage."""
    trailer_at = reader.region_bytes - TRAILER_BYTES
    page = reader.page(trailer_at, read_ahead=False)
    if not any(page):
        return [], None
    trailer = unpack_trailer(page, salt)
    if trailer is None:
        return [], "its trailer (its last page) is damaged"
    if trailer.epoch < epoch:
        return [], None
    if trailer.epoch > epoch:
        return [], "its trailer names a newer filling than its start record"
    # A footer lies page aligned before the trailer, and holds at least an empty msgpack array.
    padded = align_up(trailer.footer_bytes)
    if trailer.footer_offset % PAGE_BYTES or trailer.footer_offset + padded > trailer_at:
        return [], "its trailer locates no footer"
    if not trailer.footer_bytes:
        return [], "its trailer locates no footer"
    blob = reader.read(trailer.footer_offset, padded)
    rows = unpack_footer(blob[: trailer.footer_bytes], trailer, salt)
    if rows is None:
        return [], "its footer is damaged"
    if any(blob[trailer.footer_bytes :]):
        return rows, "its footer's padding is damaged"
    return rows, None


def walk(
    reader: RegionReader, salt: int, epoch: int, on_hole: Callable[[int, int], None]
) -> Iterator[tuple[int, RecordHeader]]:
    """Every valid record of ``epoch``, in order, as (offset from the region's start, header)."""
    limit = reader.region_bytes - TRAILER_BYTES
    offset = 0
    while offset + HEADER_BYTES <= limit:
        header = unpack_header(reader.page(offset), salt)
        if header is None or header.epoch != epoch or offset + header.record_bytes > limit:
            found = _next_header(reader, salt, epoch, offset + PAGE_BYTES, limit)
            if found is None:
                return
            on_hole(offset, found)
            offset = found
            continue
        yield offset, header
        offset += header.record_bytes


def _next_header(
    reader: RegionReader, salt: int, epoch: int, offset: int, limit: int
) -> int | None:
    while offset + HEADER_BYTES <= limit:
        page = reader.page(offset)
        if page[:8] == RECORD_MAGIC:
            header = unpack_header(page, salt)
            if header is not None and header.epoch == epoch:
                return offset
        offset += PAGE_BYTES
    return None


_DATA, _TOMBSTONE = int(Kind.DATA), int(Kind.TOMBSTONE)
_Fragment = tuple[Location, int, int, int, int]  # location, object bytes, offset, length, count


def _offer(
    objects: dict[str, Manifest],
    older: dict[ValueId, list[Manifest]],
    value_id: ValueId,
    manifest: Manifest,
) -> None:
    """A second complete version of one object: keep the newer in ``objects``, the other in
    ``older``."""
    current = objects[value_id[1]]
    if current.seq < manifest.seq:
        older[value_id].append(current)
        objects[value_id[1]] = manifest
    else:
        older[value_id].append(manifest)


def _assemble(seq: int, fragments: dict[int, _Fragment]) -> Manifest | None:
    """The manifest of one version from its fragments, or None when one is missing, they
    disagree, or they do not cover the object exactly (fragment i at i * fragment bytes)."""
    first = fragments.get(0)
    if first is None:
        return None
    _, size, _, fragment_bytes, count = first
    if set(fragments) != set(range(count)) or size > count * fragment_bytes:
        return None
    for i, (_, object_bytes, offset, length, fragment_count) in fragments.items():
        expected = (size, i * fragment_bytes, min(fragment_bytes, size - i * fragment_bytes), count)
        if expected[2] <= 0 or (object_bytes, offset, length, fragment_count) != expected:
            return None
    return Manifest(seq, size, fragment_bytes, tuple(fragments[i][0] for i in range(count)))


class ProgressLog:
    """Logs a recovery's progress every few seconds, when it takes that long (tqdm, on a file
    that writes each refresh of the bar as a log line)."""

    def __init__(self) -> None:
        self._bar: tqdm[Never] | None = None

    def __call__(self, done: int, total: int) -> None:
        if self._bar is None:
            self._bar = tqdm(
                total=total,
                file=_LogLines(),
                bar_format="recovering: {n} of {total} regions read ({percentage:.0f} %), "
                "{elapsed} elapsed, {remaining} left",
                mininterval=5.0,
                delay=5.0,  # a fast recovery logs nothing
            )
        if done < total:
            self._bar.update(done - self._bar.n)
        else:
            self._bar.n = done  # close() logs the last line, once, if it logged any before
            self._bar.close()


class _LogLines:
    """A file for tqdm: each line it writes (it starts them with \\r) becomes a log line."""

    def write(self, text: str) -> int:
        if line := text.strip("\r\n "):
            log.info("%s", line)
        return len(text)

    def flush(self) -> None:
        pass
