"""The index footer of a sealed region: its records' headers in one place, for a fast restart.

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

import struct
from dataclasses import dataclass

import msgpack

from adp_gateway.checksum import checksum
from adp_gateway.format import HEADER_BYTES, RecordHeader

TRAILER_MAGIC = b"ADPFOOT1"
FOOTER_VERSION = 1
TRAILER_BYTES = HEADER_BYTES
ENTRY_BYTES_MAX = 128  # msgpack of one entry without its names: 11 fields of at most 9 bytes
_TRAILER = struct.Struct("<8sHHIQQQQ")
_CHECKSUM = struct.Struct("<Q")
_CHECKSUM_OFFSET = TRAILER_BYTES - _CHECKSUM.size


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
