"""A database's superblock at start-up: read (from its own page, or from the copy every
region's start record keeps), checked against the config, or written by a format.

The superblock (geometry and the salt every header checksum is seeded with) is kept twice and
more: in the database's first page, and in the start record of every region in use
(format.py, ``pack_region_start``). A damaged first page is rebuilt from a copy, checked twice
(the copy's own checksum, then the start record's header checksum seeded with the copy's
salt), and rewritten. Only a database that holds nothing at all (every region's first page
zeros, and a first page of zeros or of a superblock of ours) is formatted by the gateway
itself; anything else without a readable superblock is refused with one line naming
``adp-gateway check``, and a database of another format version with one naming
``adp-gateway format --force``, which is the one way to empty a database that holds anything.
"""

from __future__ import annotations

import logging
import secrets
import struct
from typing import NamedTuple

from adp_gateway.card.software.devices.base import Device
from adp_gateway.card.software.devices.reader import aligned
from adp_gateway.card.software.format import (
    FORMAT_VERSION,
    SUPERBLOCK_MAGIC,
    Kind,
    Superblock,
    pack_superblock,
    superblock_copy,
    superblock_version,
    unpack_header,
    unpack_superblock,
)
from adp_gateway.errors import StartupError
from adp_wire.ring.layout import PAGE_BYTES

log = logging.getLogger(__name__)
LABELS_BYTES = 2**20  # the head of a device that others' labels use (``blank``)
_REGION_BYTES_AT = struct.Struct("<Q")  # region_bytes, at offset 16 of a superblock
_REGION_BYTES_OFFSET = 16


class Found(NamedTuple):
    superblock: Superblock
    copy_region: int | None  # None: the database's own first page; else the region whose copy


def read_superblock(device: Device, region_bytes: int) -> Found | None:
    """The database's superblock: its first page, or, when that is damaged, the copy in a
    region's start record (regions located at ``region_bytes``, or at the size the damaged
    page still names). None when neither can be read."""
    page = aligned(PAGE_BYTES)
    device.read([page], 0)
    found = unpack_superblock(page)
    if found is not None:
        return Found(found, None)
    candidates = [region_bytes]
    (named,) = _REGION_BYTES_AT.unpack_from(page, _REGION_BYTES_OFFSET)
    if named != region_bytes and named % PAGE_BYTES == 0 and named >= 2 * PAGE_BYTES:
        candidates.append(named)
    for size in candidates:
        copy = _copy_in_regions(device, size)
        if copy is not None:
            return copy
    return None


def _copy_in_regions(device: Device, region_bytes: int) -> Found | None:
    page = aligned(PAGE_BYTES)
    for region, start in enumerate(region_starts(device, region_bytes)):
        device.read([page], start)
        copy = superblock_copy(page)
        if copy is None or copy.region_bytes != region_bytes:
            continue
        header = unpack_header(page, copy.salt)  # the copy's salt opens its own start record
        if header is not None and header.kind == Kind.REGION:
            return Found(copy, region)
    return None


def open_superblock(device: Device, index: int, region_bytes: int) -> Superblock:
    """Database ``index``'s superblock, restored from a copy when its page is damaged, or
    written by a format when the database holds nothing. Raises StartupError for a database
    of another format version or region size, and for one that holds something but no
    readable superblock."""
    found = read_superblock(device, region_bytes)
    if found is None:
        return _format_if_empty(device, index, region_bytes)
    superblock = found.superblock
    if superblock.region_bytes != region_bytes:
        raise StartupError(
            f"database {index}{_at(device)} was formatted with region_size "
            f"{superblock.region_bytes}, the config says {region_bytes}: restore region_size, "
            "use a new data dir, or empty it with `adp-gateway format --force`"
        )
    if found.copy_region is not None:
        log.warning(
            "database %d%s: its superblock is damaged; restored from the copy in region %d's "
            "start record",
            index,
            _at(device),
            found.copy_region,
        )
        write_superblock(device, superblock)
    return superblock


def _format_if_empty(device: Device, index: int, region_bytes: int) -> Superblock:
    page = aligned(PAGE_BYTES)
    device.read([page], 0)
    version = superblock_version(page)
    if version is not None and version != FORMAT_VERSION:
        raise StartupError(
            f"database {index}{_at(device)} holds format version {version} (another "
            f"lmcache-adp release); this gateway reads version {FORMAT_VERSION}: run the "
            "release that wrote it, or empty it with `adp-gateway format --force` (with this "
            "gateway's --config or --data-dir; its cached objects are lost)"
        )
    ours = any(page) and bytes(page[:8]) == SUPERBLOCK_MAGIC
    if (any(page) and not ours) or not blank(device, region_bytes):
        raise StartupError(
            f"database {index}{_at(device)} has no readable superblock (nor a copy in its "
            "regions) but is not empty, so the gateway will not format it: run `adp-gateway "
            "check` to see what it holds; `adp-gateway format --force` empties it, or fix "
            "`data_dirs`/`devices` if it is not this gateway's"
        )
    if ours:
        log.warning(
            "database %d%s: its superblock is damaged and it holds no region: formatting it",
            index,
            _at(device),
        )
    return Superblock(index, region_bytes, format_device(device, index, region_bytes))


def format_device(device: Device, index: int, region_bytes: int) -> int:
    """Write a new superblock (a new salt) and zero every region's first and last page;
    returns the salt. The regions' other bytes stay, but no header checksummed with another
    salt is believed, and no region without a start record is read."""
    salt = secrets.randbits(64)
    zeros = aligned(PAGE_BYTES)
    for start in region_starts(device, region_bytes):
        device.write([zeros], start)
        device.write([zeros], start + region_bytes - PAGE_BYTES)
    device.sync()  # the regions are empty before the new superblock says so
    write_superblock(device, Superblock(index, region_bytes, salt))
    return salt


def write_superblock(device: Device, superblock: Superblock) -> None:
    page = aligned(PAGE_BYTES)
    pack_superblock(superblock, page)
    device.write([page], 0)
    device.sync()


def regions_in_use(device: Device, region_bytes: int) -> int:
    """How many regions of ``device`` have a first page that is not zeros (a filling's start
    record, or bytes of something else): what a format would lose."""
    page = aligned(PAGE_BYTES)
    used = 0
    for start in region_starts(device, region_bytes):
        device.read([page], start)
        used += any(page)
    return used


def blank(device: Device, region_bytes: int) -> bool:
    """Whether ``device`` holds zeros wherever a format writes (each region's first and last
    page) and in its first MiB after the superblock's page, where partition tables and the
    labels of filesystems, RAID and volume managers lie: only such a device is formatted
    unasked (a btrfs has its first label at 64 KiB, a copy at 64 MiB)."""
    head = aligned(min(LABELS_BYTES, (device.size_bytes - PAGE_BYTES) // PAGE_BYTES * PAGE_BYTES))
    device.read([head], PAGE_BYTES)
    if bytes(head).count(0) != len(head):
        return False
    page = aligned(PAGE_BYTES)
    for start in region_starts(device, region_bytes):
        for offset in (start, start + region_bytes - PAGE_BYTES):
            device.read([page], offset)
            if any(page):
                return False
    return True


def region_starts(device: Device, region_bytes: int) -> list[int]:
    """The device offset of every region (after the superblock's page)."""
    count = (device.size_bytes - PAGE_BYTES) // region_bytes
    return [PAGE_BYTES + region * region_bytes for region in range(count)]


def _at(device: Device) -> str:
    path = getattr(device, "path", None)
    return f" ({path})" if path else ""
