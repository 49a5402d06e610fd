"""Sealing a region: its index footer (its records' headers in one place, for a fast restart),
the room a filling keeps for it, and the writing of it once the region's last write has landed.

A sealed region ends with a footer (a msgpack list, one entry per record, padded to 4 KiB) right
after its last record, and a trailer in the region's last 4 KiB page that locates the footer::

    magic "ADPFOOT1" | version u16 | reserved u16 | entries u32 | epoch u64
    footer_offset u64 (from the region's start) | footer_bytes u64 | footer_checksum u64
    zeros ... | trailer_checksum u64 @ 4088

Both checksums are xxh3_64 seeded with the database's salt. A recovery believes a footer only
when its trailer has the region's epoch and both checksums hold; otherwise it scans the region's
record headers, which say the same thing. So a footer only ever saves time: losing one (a crash
before it was written, a torn write) costs a scan, never data.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass

import msgpack

from adp_gateway.card.software.devices.reader import RegionReader, aligned
from adp_gateway.card.software.format import HEADER_BYTES, RecordHeader
from adp_gateway.card.software.regions import Database, LogState, Region
from adp_wire.checksum import checksum
from adp_wire.ring.layout import align_up

TRAILER_MAGIC = b"ADPFOOT1"
FOOTER_VERSION = 1
TRAILER_BYTES = HEADER_BYTES
ENTRY_BYTES_MAX = 128  # msgpack of one entry without its names: 11 fields of at most 9 bytes
_TRAILER = struct.Struct("<8sHHIQQQQ")
_CHECKSUM = struct.Struct("<Q")
_CHECKSUM_OFFSET = TRAILER_BYTES - _CHECKSUM.size
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Trailer:
    entries: int
    epoch: int
    footer_offset: int
    footer_bytes: int
    footer_checksum: int


def entry_bytes_max(header: RecordHeader) -> int:
    """An upper bound of what ``header`` adds to its region's footer."""
    return ENTRY_BYTES_MAX + len(header.tenant.encode()) + len(header.key.encode())


# One footer entry: (offset in region, kind, seq, tenant, key, object_bytes, fragment_offset,
# fragment_bytes, fragment_index, fragment_count, payload_checksum). Recovery works on these
# tuples directly: building a RecordHeader per record would cost most of a restart.
FooterRow = tuple[int, int, int, str, str, int, int, int, int, int, int]
ROW_FIELDS = 11


def row_of(offset: int, h: RecordHeader) -> FooterRow:
    return (
        offset,
        int(h.kind),
        h.seq,
        h.tenant,
        h.key,
        h.object_bytes,
        h.fragment_offset,
        h.fragment_bytes,
        h.fragment_index,
        h.fragment_count,
        h.payload_checksum,
    )


def pack_footer(records: list[tuple[int, RecordHeader]]) -> bytes:
    """The footer of ``records`` (offset in the region, header), unpadded."""
    return bytes(msgpack.packb([row_of(offset, h) for offset, h in records]))


def pack_trailer(trailer: Trailer, out: memoryview, seed: int) -> None:
    out[:] = bytes(TRAILER_BYTES)
    _TRAILER.pack_into(
        out,
        0,
        TRAILER_MAGIC,
        FOOTER_VERSION,
        0,
        trailer.entries,
        trailer.epoch,
        trailer.footer_offset,
        trailer.footer_bytes,
        trailer.footer_checksum,
    )
    _CHECKSUM.pack_into(out, _CHECKSUM_OFFSET, checksum(out[:_CHECKSUM_OFFSET], seed))


def unpack_trailer(buf: memoryview, seed: int) -> Trailer | None:
    if len(buf) < TRAILER_BYTES or bytes(buf[:8]) != TRAILER_MAGIC:
        return None
    (stored,) = _CHECKSUM.unpack_from(buf, _CHECKSUM_OFFSET)
    if stored != checksum(buf[:_CHECKSUM_OFFSET], seed):
        return None
    _, version, _, entries, epoch, offset, length, footer_checksum = _TRAILER.unpack_from(buf)
    if version != FOOTER_VERSION:
        return None
    return Trailer(entries, epoch, offset, length, footer_checksum)


def unpack_footer(blob: memoryview, trailer: Trailer, seed: int) -> list[FooterRow] | None:
    """The rows a footer lists; None if it is not intact. Its salted checksum held, so the
    gateway wrote it: only its shape is checked."""
    if checksum(blob, seed) != trailer.footer_checksum:
        return None
    try:
        rows = msgpack.unpackb(blob, use_list=False)
    except (ValueError, TypeError, msgpack.UnpackException):
        return None
    if not isinstance(rows, tuple) or len(rows) != trailer.entries:
        return None
    # Every row a msgpack array (a tuple) of ROW_FIELDS, not a string, bytes or a map of that
    # length; one set over the rows, no Python loop per row: a restart reads 100,000 of them.
    if rows and {len(row) if type(row) is tuple else -1 for row in rows} != {ROW_FIELDS}:
        return None
    return list(rows)


def fits(region: Region, header: RecordHeader, region_bytes: int) -> bool:
    """Whether ``header``'s record, and its footer entry, still fit in ``region`` before the
    footer and trailer it must keep room for."""
    footer = align_up(region.footer_bytes + entry_bytes_max(header))
    return region.used_bytes + header.record_bytes + footer + TRAILER_BYTES <= region_bytes


def write_cost(payload_bytes: int, names_bytes: int, region_bytes: int) -> int:
    """The device bytes a record of ``payload_bytes`` costs when written: its header page and
    payload pages, its footer entry, and its share of its region's start record and trailer
    (a region filled with such records holds as many as fit)."""
    record = HEADER_BYTES + align_up(payload_bytes) + ENTRY_BYTES_MAX + names_bytes
    per_region = max(1, (region_bytes - HEADER_BYTES - TRAILER_BYTES) // record)
    return record + -(-(HEADER_BYTES + TRAILER_BYTES) // per_region)


def write_footer(
    reader: RegionReader, salt: int, epoch: int, records: list[tuple[int, RecordHeader]]
) -> bool:
    """Write the footer of ``records`` right after the last one, and the trailer; False when it
    does not fit. Raises OSError."""
    records = sorted(records, key=lambda r: r[0])
    footer_offset = records[-1][0] + records[-1][1].record_bytes if records else 0
    blob = pack_footer(records)
    padded = align_up(len(blob))
    if footer_offset + padded + TRAILER_BYTES > reader.region_bytes:
        return False
    buf = aligned(padded)
    buf[: len(blob)] = blob
    trailer_page = aligned(TRAILER_BYTES)
    trailer = Trailer(len(records), epoch, footer_offset, len(blob), checksum(blob, salt))
    pack_trailer(trailer, trailer_page, salt)
    reader.device.write([buf], reader.start + footer_offset)
    reader.device.write([trailer_page], reader.start + reader.region_bytes - TRAILER_BYTES)
    return True


class Sealer:
    """Writes a sealed region's footer once its last write has landed. A footer write counts in
    the region's ``writes_inflight``, so the region is not reclaimed under it."""

    def __init__(self, state: LogState) -> None:
        self._state = state

    def ready(self, region: Region) -> bool:
        """Under the lock: whether the footer is due now; if so the caller writes it."""
        if region.sealed and region.writes_inflight == 0 and region.records:
            region.writes_inflight += 1  # the footer write: no reclaim meanwhile
            return True
        return False

    def write(self, db: Database, region: Region) -> None:
        """Write ``region``'s footer and trailer (counted in its writes_inflight)."""
        try:
            with self._state.lock:
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
            with self._state.lock:
                region.writes_inflight -= 1

    def seal_open(self, db: Database) -> None:
        """Seal ``db``'s open regions and write their footers (at close: a restart then reads
        every region's footer rather than walking it)."""
        with self._state.lock:
            ready = []
            for region in db.open.values():
                region.sealed = True
                if self.ready(region):
                    ready.append(region)
            db.open.clear()
        for region in ready:
            self.write(db, region)
