"""Goal: a sealed region's footer is believed only when it is intact and well formed; any other
footer or trailer costs a walk of the region's headers, never a record or the recovery."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from gateway.footer import Trailer, pack_footer, row_of, unpack_footer
from gateway.format import Kind, RecordHeader, checksum

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
