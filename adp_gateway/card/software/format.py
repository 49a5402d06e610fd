"""The on-disk record: a 4 KiB self-describing header, then the payload padded to 4 KiB.

Header layout (little endian), checksummed as a whole by the xxh3_64 in its last 8 bytes::

    magic "ADPFRAG1" | version u16 | kind u8 | flags u8 | reserved u32
    epoch u64 (the region generation) | seq u64 (global, increasing) | key_hash u64
    object_bytes u64 | fragment_offset u64 | fragment_bytes u32
    fragment_index u16 | fragment_count u16 | payload_checksum u64 (xxh3_64 of the logical bytes)
    tenant_bytes u16 | key_bytes u16 | tenant | key | zeros ... | header_checksum u64 @ 4088

docs/on-disk-format.md describes the same thing for operators.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from adp_wire.checksum import checksum, key_hash
from adp_wire.ring.layout import PAGE_BYTES, align_up

RECORD_MAGIC = b"ADPFRAG1"
# 1: an object's fragments were the card's records, named by the object's key. 2: one record
# per value of the card (adp_gateway/card/base.py), named key#version.place... by the object
# store, and the superblock kept in every region's start record too. A database of another
# version is refused at start, naming `adp-gateway format --force`; it is never half read.
FORMAT_VERSION = 2
HEADER_BYTES = PAGE_BYTES
_FIXED = struct.Struct("<8sHBBIQQQQQIHHQHH")
_CHECKSUM = struct.Struct("<Q")
_CHECKSUM_OFFSET = HEADER_BYTES - _CHECKSUM.size
NAME_BYTES_MAX = _CHECKSUM_OFFSET - _FIXED.size


class Kind(IntEnum):
    DATA = 1
    TOMBSTONE = 2
    REGION = 3  # header-only first record of every filling of a region: gives its epoch


_KINDS = {int(kind): kind for kind in Kind}


@dataclass(frozen=True)
class RecordHeader:
    kind: Kind
    seq: int
    tenant: str
    key: str
    object_bytes: int
    fragment_offset: int = 0
    fragment_bytes: int = 0
    fragment_index: int = 0
    fragment_count: int = 1
    payload_checksum: int = 0
    epoch: int = 0

    @property
    def record_bytes(self) -> int:
        """Bytes the record takes on the device: header plus the payload padded to 4 KiB."""
        return HEADER_BYTES + align_up(self.fragment_bytes)


def pack_header(header: RecordHeader, out: memoryview, seed: int) -> None:
    """Write ``header`` into the 4 KiB buffer ``out``; ``seed`` is the database's secret salt,
    so a tenant cannot forge a header inside a payload that a recovery scan would believe."""
    tenant, key = header.tenant.encode(), header.key.encode()
    assert len(out) == HEADER_BYTES and len(tenant) + len(key) <= NAME_BYTES_MAX
    out[:] = bytes(HEADER_BYTES)
    _FIXED.pack_into(
        out,
        0,
        RECORD_MAGIC,
        FORMAT_VERSION,
        header.kind,
        0,
        0,
        header.epoch,
        header.seq,
        key_hash(header.tenant, header.key),
        header.object_bytes,
        header.fragment_offset,
        header.fragment_bytes,
        header.fragment_index,
        header.fragment_count,
        header.payload_checksum,
        len(tenant),
        len(key),
    )
    names = _FIXED.size
    out[names : names + len(tenant) + len(key)] = tenant + key
    _CHECKSUM.pack_into(out, _CHECKSUM_OFFSET, checksum(out[:_CHECKSUM_OFFSET], seed))


def unpack_header(buf: bytes | memoryview, seed: int) -> RecordHeader | None:
    """Parse a header read from disk; None for anything that is not a valid record header."""
    if len(buf) < HEADER_BYTES or bytes(buf[:8]) != RECORD_MAGIC:
        return None
    (stored,) = _CHECKSUM.unpack_from(buf, _CHECKSUM_OFFSET)
    if stored != checksum(buf[:_CHECKSUM_OFFSET], seed):
        return None
    (
        _,
        version,
        kind,
        _,
        _,
        epoch,
        seq,
        hashed,
        object_bytes,
        fragment_offset,
        fragment_bytes,
        fragment_index,
        fragment_count,
        payload_checksum,
        tenant_len,
        key_len,
    ) = _FIXED.unpack_from(buf)
    kind = _KINDS.get(kind)
    if version != FORMAT_VERSION or kind is None:
        return None
    if tenant_len + key_len > NAME_BYTES_MAX or fragment_index >= max(fragment_count, 1):
        return None
    if fragment_offset + fragment_bytes > object_bytes and kind == Kind.DATA:
        return None
    names = bytes(buf[_FIXED.size : _FIXED.size + tenant_len + key_len])
    try:
        tenant, key = names[:tenant_len].decode(), names[tenant_len:].decode()
    except UnicodeDecodeError:
        return None
    if key_hash(tenant, key) != hashed:
        return None
    return RecordHeader(
        kind,
        seq,
        tenant,
        key,
        object_bytes,
        fragment_offset,
        fragment_bytes,
        fragment_index,
        fragment_count,
        payload_checksum,
        epoch,
    )


SUPERBLOCK_MAGIC = b"ADPDBSB1"
_SUPERBLOCK = struct.Struct("<8sHHIQQ")  # magic, version, database, reserved, region_bytes, salt


@dataclass(frozen=True)
class Superblock:
    """The first 4 KiB of every database: its geometry and the salt that seeds header checksums."""

    database: int
    region_bytes: int
    salt: int


def pack_superblock(superblock: Superblock, out: memoryview) -> None:
    out[:] = bytes(HEADER_BYTES)
    _SUPERBLOCK.pack_into(
        out,
        0,
        SUPERBLOCK_MAGIC,
        FORMAT_VERSION,
        superblock.database,
        0,
        superblock.region_bytes,
        superblock.salt,
    )
    _CHECKSUM.pack_into(out, _CHECKSUM_OFFSET, checksum(out[:_CHECKSUM_OFFSET]))


def superblock_version(buf: bytes | memoryview) -> int | None:
    """The format version of the superblock in ``buf``, whatever it is (every version starts
    with the same fields); None where there is no intact superblock."""
    if len(buf) < HEADER_BYTES:
        return None
    (stored,) = _CHECKSUM.unpack_from(buf, _CHECKSUM_OFFSET)
    magic, version, *_ = _SUPERBLOCK.unpack_from(buf)
    if magic != SUPERBLOCK_MAGIC or stored != checksum(buf[:_CHECKSUM_OFFSET]):
        return None
    return int(version)


# Every region's start record carries a copy of the superblock at this offset of its page (the
# start record's own fields and pool name end far before it), with a checksum of its own, so a
# database whose superblock is damaged is read from the copy its regions keep.
SUPERBLOCK_COPY_AT = 2048


def pack_region_start(
    header: RecordHeader, superblock: Superblock, out: memoryview, seed: int
) -> None:
    """Write the region start record ``header`` (kind REGION) with a copy of ``superblock``."""
    assert header.kind == Kind.REGION
    pack_header(header, out, seed)
    copy = memoryview(bytearray(HEADER_BYTES))
    pack_superblock(superblock, copy)
    at = SUPERBLOCK_COPY_AT
    out[at : at + _SUPERBLOCK.size] = copy[: _SUPERBLOCK.size]
    _CHECKSUM.pack_into(out, at + _SUPERBLOCK.size, checksum(out[at : at + _SUPERBLOCK.size]))
    _CHECKSUM.pack_into(out, _CHECKSUM_OFFSET, checksum(out[:_CHECKSUM_OFFSET], seed))


def superblock_copy(buf: bytes | memoryview) -> Superblock | None:
    """The copy of the superblock a region start page carries, when it is intact and of this
    format version (its caller confirms the page with the copy's salt)."""
    if len(buf) < HEADER_BYTES or bytes(buf[:8]) != RECORD_MAGIC:
        return None
    at = SUPERBLOCK_COPY_AT
    (stored,) = _CHECKSUM.unpack_from(buf, at + _SUPERBLOCK.size)
    if stored != checksum(buf[at : at + _SUPERBLOCK.size]):
        return None
    magic, version, database, _, region_bytes, salt = _SUPERBLOCK.unpack_from(buf, at)
    if magic != SUPERBLOCK_MAGIC or version != FORMAT_VERSION:
        return None
    return Superblock(database, region_bytes, salt)


def unpack_superblock(buf: bytes | memoryview) -> Superblock | None:
    """The superblock in ``buf``, or None where there is none (a new or foreign device)."""
    if len(buf) < HEADER_BYTES:
        return None
    (stored,) = _CHECKSUM.unpack_from(buf, _CHECKSUM_OFFSET)
    magic, version, database, _, region_bytes, salt = _SUPERBLOCK.unpack_from(buf)
    if magic != SUPERBLOCK_MAGIC or stored != checksum(buf[:_CHECKSUM_OFFSET]):
        return None
    if version != FORMAT_VERSION:
        return None
    return Superblock(database, region_bytes, salt)
