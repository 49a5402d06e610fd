"""A database's superblock at start-up: read, checked against the config, or written by a
format (a new salt, and every region's first and last page zeroed, so nothing an earlier
format left there is believed).

A database written by another format version is refused with one line naming the fix
(``adp-gateway format --force``, which empties it): it is never half read.
"""

from __future__ import annotations

import logging
import secrets

from adp_gateway.card.software.devices.base import Device
from adp_gateway.card.software.devices.reader import aligned
from adp_gateway.errors import StartupError
from adp_gateway.format import (
    FORMAT_VERSION,
    Superblock,
    pack_superblock,
    superblock_version,
    unpack_superblock,
)
from adp_wire.ring.layout import PAGE_BYTES

log = logging.getLogger(__name__)


def open_superblock(device: Device, index: int, region_bytes: int) -> int:
    """The salt of database ``index`` on ``device``, formatting it first when it holds no
    superblock. Raises StartupError for a database of another format version or region size."""
    page = aligned(PAGE_BYTES)
    device.read([page], 0)
    found = unpack_superblock(page)
    if found is not None:
        if found.region_bytes != region_bytes:
            raise StartupError(
                f"database {index} was formatted with region_size {found.region_bytes}, "
                f"the config says {region_bytes}: restore region_size, use a new data dir, "
                "or empty it with `adp-gateway format --force`"
            )
        return found.salt
    version = superblock_version(page)
    if version is not None:
        raise StartupError(
            f"database {index}{_at(device)} holds format version {version} (another "
            f"lmcache-adp release); this gateway reads version {FORMAT_VERSION}: run the "
            "release that wrote it, or empty it with `adp-gateway format --force` (with this "
            "gateway's --config or --data-dir; its cached objects are lost)"
        )
    if any(page):
        log.warning(
            "database %d has no valid superblock but is not empty: formatting it "
            "(whatever it held is lost)",
            index,
        )
    return format_device(device, index, region_bytes)


def format_device(device: Device, index: int, region_bytes: int) -> int:
    """Write a new superblock (a new salt) and zero every region's first and last page;
    returns the salt. The regions' other bytes stay, but no header checksummed with another
    salt is believed, and no region without a start record is read."""
    salt = secrets.randbits(64)
    page = aligned(PAGE_BYTES)
    pack_superblock(Superblock(index, region_bytes, salt), page)
    zeros = aligned(PAGE_BYTES)
    for start in region_starts(device, region_bytes):
        device.write([zeros], start)
        device.write([zeros], start + region_bytes - PAGE_BYTES)
    device.sync()  # the regions are empty before the new superblock says so
    device.write([page], 0)
    device.sync()
    return salt


def regions_in_use(device: Device, region_bytes: int) -> int:
    """How many regions of ``device`` have a first page that is not zeros (a filling's start
    record, or bytes of something else): what a format would lose."""
    page = aligned(PAGE_BYTES)
    used = 0
    for start in region_starts(device, region_bytes):
        device.read([page], start)
        used += any(page)
    return used


def region_starts(device: Device, region_bytes: int) -> list[int]:
    """The device offset of every region (after the superblock's page)."""
    count = (device.size_bytes - PAGE_BYTES) // region_bytes
    return [PAGE_BYTES + region * region_bytes for region in range(count)]


def _at(device: Device) -> str:
    path = getattr(device, "path", None)
    return f" ({path})" if path else ""
