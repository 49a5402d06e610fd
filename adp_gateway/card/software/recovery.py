"""Reading one region back without trusting anything (its footer, or a walk of its headers),
and writing its footer.

``read_footer`` returns what a sealed region's footer lists (sealing.py), or None. A
``walk`` goes header by header from the region's start, through a 1 MiB read-ahead window so that
small records cost one read per MiB, not one per record. It stops believing at a header that is
invalid or of another epoch, and looks forward page by page for the next header of the same
epoch (a torn or failed write leaves such a hole); each hole is reported to ``on_hole``.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Iterator

from adp_gateway.card.software.devices.base import Device
from adp_gateway.card.software.sealing import (
    TRAILER_BYTES,
    FooterRow,
    Trailer,
    pack_footer,
    pack_trailer,
    unpack_footer,
    unpack_trailer,
)
from adp_gateway.checksum import checksum
from adp_gateway.format import HEADER_BYTES, RECORD_MAGIC, RecordHeader, unpack_header
from adp_gateway.ring.layout import PAGE_BYTES, align_up

READ_AHEAD_BYTES = 2**20


def aligned(size: int) -> memoryview:
    """A page-aligned, zeroed buffer (anonymous mmap), as O_DIRECT requires."""
    return memoryview(mmap.mmap(-1, size))


class RegionReader:
    """Pages of one region, read through a window that moves forward."""

    def __init__(self, device: Device, start: int, region_bytes: int) -> None:
        self.device = device
        self.start = start
        self.region_bytes = region_bytes
        self._buffer = aligned(READ_AHEAD_BYTES)
        self._at = 0
        self._length = 0

    def page(self, offset: int, read_ahead: bool = True) -> memoryview:
        """The 4 KiB page at ``offset`` from the region's start."""
        if not (self._at <= offset and offset + PAGE_BYTES <= self._at + self._length):
            ahead = READ_AHEAD_BYTES if read_ahead else PAGE_BYTES
            self._length = min(ahead, self.region_bytes - offset)
            self._at = offset
            self.device.read([self._buffer[: self._length]], self.start + offset)
        return self._buffer[offset - self._at : offset - self._at + PAGE_BYTES]

    def read(self, offset: int, length: int) -> memoryview:
        buf = aligned(align_up(length))
        self.device.read([buf], self.start + offset)
        return buf[:length]


def first_header(reader: RegionReader, salt: int) -> RecordHeader | None:
    """The header of the region's first record, which gives its epoch; None: a free region."""
    return unpack_header(reader.page(0, read_ahead=False), salt)


def read_footer(reader: RegionReader, salt: int, epoch: int) -> list[FooterRow]:
    """The rows a valid footer of this epoch lists; [] when there is none."""
    trailer_at = reader.region_bytes - TRAILER_BYTES
    trailer = unpack_trailer(reader.page(trailer_at, read_ahead=False), salt)
    if trailer is None or trailer.epoch != epoch:
        return []
    # A footer lies page aligned before the trailer, and holds at least an empty msgpack array.
    end = trailer.footer_offset + trailer.footer_bytes
    if trailer.footer_offset % PAGE_BYTES or end > trailer_at or not trailer.footer_bytes:
        return []
    rows = unpack_footer(reader.read(trailer.footer_offset, trailer.footer_bytes), trailer, salt)
    return rows or []


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
