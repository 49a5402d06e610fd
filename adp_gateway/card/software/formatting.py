"""``adp-gateway format [--force]``: empty the databases the config names, by formatting them.

A format writes a new superblock (a new salt) and zeroes every region's first and last page:
the cache starts empty, whatever the databases held. It is the one way to empty a database
that holds anything: the gateway never formats such a database itself. Without ``--force``
only databases that hold nothing yet are formatted, and the others are named; with it, every
database is. It takes the same locks as the gateway (never beside a running one, nor beside
``adp-gateway check``), and uses the config's ``region_size`` (the way to change it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from adp_gateway.card.software.devices.filedevice import FileDevice, open_existing
from adp_gateway.card.software.devices.reader import aligned
from adp_gateway.card.software.format import unpack_superblock
from adp_gateway.card.software.settings import SoftwareCardConfig
from adp_gateway.card.software.superblocks import blank, format_device, regions_in_use
from adp_wire.ring.layout import PAGE_BYTES
from adp_wire.units import format_size


@dataclass
class Formatted:
    lines: list[str] = field(default_factory=list)
    refused: int = 0


def format_databases(config: SoftwareCardConfig, force: bool) -> Formatted:
    """Format each database of ``config`` that exists (all of them with ``force``, else those
    that hold nothing); one line per database says what was done."""
    done = Formatted()
    for index, path in enumerate(config.database_paths):
        if not os.path.exists(path):
            done.lines.append(f"database {index} {path}: none there (`serve` makes it)")
            continue
        device = open_existing(path)
        try:
            used = _held(device, config.region_size)
            if used and not force:
                done.refused += 1
                done.lines.append(
                    f"database {index} {path}: holds {used}; not formatted (`adp-gateway "
                    "check` shows what; add --force to empty it)"
                )
                continue
            format_device(device, index, config.region_size)
            regions = (device.size_bytes - PAGE_BYTES) // config.region_size
            done.lines.append(
                f"database {index} {path}: formatted, {regions} regions of "
                f"{format_size(config.region_size)}, empty"
            )
        finally:
            device.close()
    return done


def _held(device: FileDevice, region_bytes: int) -> str:
    """What a format of ``device`` would lose, in words; "" for nothing."""
    page = aligned(PAGE_BYTES)
    device.read([page], 0)
    found = unpack_superblock(page)
    in_use = regions_in_use(device, found.region_bytes if found else region_bytes)
    if in_use:
        return f"{in_use} region(s) in use"
    if any(page) and found is None:
        return "a first page that is no superblock of this release"
    if found is None and not blank(device, region_bytes):
        return "bytes where a format writes (another program's labels or data?)"
    return ""
