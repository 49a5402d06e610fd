"""Goal: records describe themselves, and anything damaged or forged parses as nothing."""

from __future__ import annotations

import mmap

import pytest

from adp_gateway.card.software.format import (
    HEADER_BYTES,
    Kind,
    RecordHeader,
    Superblock,
    pack_header,
    pack_superblock,
    unpack_header,
    unpack_superblock,
)

SEED = 0x5EED
HEADER = RecordHeader(
    Kind.DATA,
    seq=7,
    tenant="t",
    key="model@00000000@0@abc",
    object_bytes=10000,
    fragment_offset=4096,
    fragment_bytes=5904,
    fragment_index=1,
    fragment_count=2,
    payload_checksum=99,
    epoch=3,
)


def packed(header: RecordHeader = HEADER) -> memoryview:
    page = memoryview(mmap.mmap(-1, HEADER_BYTES))
    pack_header(header, page, SEED)
    return page


def test_header_round_trips() -> None:
    assert unpack_header(packed(), SEED) == HEADER
    assert HEADER.record_bytes == HEADER_BYTES + 8192


@pytest.mark.parametrize("offset", [0, 9, 20, 60, 90, 100, 4000, 4090])
def test_any_flipped_byte_invalidates_the_header(offset: int) -> None:
    page = packed()
    page[offset] ^= 0x01
    assert unpack_header(page, SEED) is None


def test_a_header_checksummed_with_another_salt_is_not_believed() -> None:
    assert unpack_header(packed(), SEED + 1) is None


def test_zeros_and_garbage_are_not_headers() -> None:
    assert unpack_header(bytes(HEADER_BYTES), SEED) is None
    assert unpack_header(b"ADPFRAG1" + bytes(HEADER_BYTES - 8), SEED) is None
    assert unpack_header(b"short", SEED) is None


def test_superblock_round_trips_and_rejects_damage() -> None:
    page = memoryview(mmap.mmap(-1, HEADER_BYTES))
    pack_superblock(Superblock(2, 2**26, 1234), page)
    assert unpack_superblock(page) == Superblock(2, 2**26, 1234)
    page[30] ^= 1
    assert unpack_superblock(page) is None
    assert unpack_superblock(page[:100]) is None  # it raised struct.error
