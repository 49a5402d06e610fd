"""Goal: a sealed region's footer is believed only when it is intact and well formed; any other
footer or trailer costs a walk of the region's headers, never a record or the recovery."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from adp_gateway.card.software.devices.memory import MemoryDevice
from adp_gateway.card.software.devices.reader import RegionReader
from adp_gateway.card.software.format import Kind, RecordHeader, unpack_superblock
from adp_gateway.card.software.recovery import first_header
from adp_gateway.card.software.regionlog import RegionLog
from adp_gateway.card.software.sealing import (
    TRAILER_BYTES,
    Trailer,
    pack_footer,
    pack_trailer,
    row_of,
    unpack_footer,
)
from adp_wire.checksum import checksum
from tests.support.storage import REGION, extent, payload

SEED = 0x5EED
HEADER = RecordHeader(Kind.DATA, 7, "t", "k", 5000, 0, 5000, payload_checksum=99, epoch=3)


def footer_of(blob: bytes, entries: int) -> list[Any] | None:
    """What unpack_footer makes of ``blob``, its salted checksum holding."""
    trailer = Trailer(entries, 3, 4096, len(blob), checksum(blob, SEED))
    return unpack_footer(memoryview(blob), trailer, SEED)


def test_footer_round_trips() -> None:
    blob = pack_footer([(4096, HEADER), (16384, HEADER)])
    assert footer_of(blob, 2) == [row_of(4096, HEADER), row_of(16384, HEADER)]
    assert footer_of(blob, 3) is None


@pytest.mark.parametrize(
    "row",
    ["k" * 11, b"k" * 11, {str(i): i for i in range(11)}, list(range(10)), 11, None],
    ids=["str", "bytes", "map", "ten-fields", "int", "nil"],
)
def test_a_footer_row_that_is_not_an_array_of_eleven_is_not_believed(row: object) -> None:
    """A row of 11 characters, bytes or map entries passed a check that took only its len()."""
    blob = bytes(msgpack.packb([row_of(4096, HEADER), row]))
    assert footer_of(blob, 2) is None


def test_a_trailer_of_an_empty_footer_costs_a_walk() -> None:
    """A trailer (checksum holds, the region's epoch) saying its footer has 0 bytes: reading
    0 bytes mapped a 0-byte buffer, and the recovery failed with OSError (EINVAL)."""
    device = MemoryDevice(4096 + 4 * REGION)
    log = RegionLog([device], REGION, lambda *r: [])
    data = payload(6, 4096)
    record = extent(data)
    for seq in range(60):  # 8 KiB records: regions 0 and 1 sealed, with footers
        header = RecordHeader(
            Kind.DATA, seq, "t", f"k{seq}", 4096, 0, 4096, payload_checksum=checksum(data)
        )
        log.append(0, header, record)
    page = extent(bytes(4096))
    device.read([page], 0)
    superblock = unpack_superblock(page)
    assert superblock is not None
    salt = superblock.salt
    first = first_header(RegionReader(device, 4096, REGION), salt)
    assert first is not None
    trailer = extent(bytes(TRAILER_BYTES))
    pack_trailer(Trailer(0, first.epoch, 4096, 0, checksum(b"", salt)), trailer, salt)
    device.write([trailer], 4096 + REGION - TRAILER_BYTES)
    recovered = RegionLog([device], REGION, lambda *r: []).scan()
    assert [row[2] for region in recovered for row in region.rows] == list(range(60))
