"""``adp-gateway check [--fix]``: walk every record of every database and verify it.

Reads each region header by header (never trusting its footer), verifies every payload checksum,
and compares what it found with the region's footer. It reports every byte it cannot account
for, by object where they were an object's and by region otherwise: a damaged superblock (read
from a region's copy), a damaged start record (the region's records are read all the same), a
payload that fails its checksum, a record the footer lists whose header is damaged, bytes
between records that hold no valid header where no footer explains them (a torn or failed
write), and a damaged trailer, footer or footer padding. With ``--fix`` it rewrites a damaged
superblock and start record, invalidates damaged records (zeroes their header, so no recovery
believes them) and rewrites the footer of every region whose footer was missing, damaged,
wrong or listed a damaged record, so the index a restart rebuilds matches the disk. It takes
the same lock as the gateway: it refuses to run while a gateway uses the databases.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Never

from tqdm import tqdm

from adp_gateway.card.base import ValueObserver
from adp_gateway.card.software.devices.filedevice import FileDevice, open_existing
from adp_gateway.card.software.devices.reader import RegionReader
from adp_gateway.card.software.format import (
    RECORD_MAGIC,
    Kind,
    RecordHeader,
    Superblock,
    unpack_header,
)
from adp_gateway.card.software.recovery import (
    damaged_filling,
    first_header,
    inspect_footer,
    invalidate,
    payload_intact,
    rewrite_start,
    walk,
)
from adp_gateway.card.software.sealing import TRAILER_BYTES, FooterRow, row_of, write_footer
from adp_gateway.card.software.superblocks import read_superblock, write_superblock
from adp_gateway.errors import StartupError
from adp_wire.ring.layout import PAGE_BYTES
from adp_wire.units import format_size


@dataclass
class CheckReport:
    databases: int = 0
    regions: int = 0
    records: int = 0
    bytes_read: int = 0
    damage: list[str] = field(default_factory=list)
    footers_missing: int = 0
    footers_wrong: int = 0
    fixed: int = 0

    def summary(self) -> str:
        return (
            f"checked {self.databases} database(s), {self.regions} region(s) in use: "
            f"{self.records} records ({format_size(self.bytes_read)} read); "
            f"{len(self.damage)} damaged; "
            f"{self.footers_missing} region(s) "
            f"without a footer, {self.footers_wrong} with a wrong one; {self.fixed} repair(s)"
        )


def check(
    paths: list[str],
    fix: bool,
    progress: Callable[[CheckReport, int, int], None],
    region_bytes: int,
    values: ValueObserver,
) -> CheckReport:
    """Check the databases at ``paths``; ``region_bytes`` (the config's) locates the regions'
    copies of a damaged superblock. ``values`` hears of each value found verified, and names
    the damaged ones."""
    report = CheckReport()
    devices = [open_existing(path) for path in paths]
    try:
        superblocks = [
            _superblock(database, path, device, region_bytes, fix, report)
            for database, (path, device) in enumerate(zip(paths, devices, strict=True))
        ]
        counts = [_regions(d, sb) for d, sb in zip(devices, superblocks, strict=True)]
        done = 0
        for database, (device, superblock) in enumerate(zip(devices, superblocks, strict=True)):
            report.databases += 1
            size = superblock.region_bytes
            for region in range(counts[database]):
                reader = RegionReader(device, PAGE_BYTES + region * size, size)
                where = f"database {database} ({paths[database]}) region {region}"
                for header in _check_region(reader, superblock, where, fix, report, values):
                    if header.kind == Kind.DATA:
                        values.seen(header.tenant, header.key)
                done += 1
                progress(report, done, sum(counts))
        if fix:
            for device in devices:
                device.sync()
        return report
    finally:
        for device in devices:
            device.close()


def _regions(device: FileDevice, superblock: Superblock) -> int:
    return (device.size_bytes - PAGE_BYTES) // superblock.region_bytes


def _check_region(
    reader: RegionReader,
    superblock: Superblock,
    where: str,
    fix: bool,
    report: CheckReport,
    values: ValueObserver,
) -> list[RecordHeader]:
    """The region's valid records; every byte of it that is not what it should be goes into
    ``report``, by object where the bytes were an object's, else by region."""
    salt = superblock.salt
    start, rebuilt = _start(reader, salt, where, report)
    if start is None:
        return []
    report.regions += 1
    holes: list[tuple[int, int]] = []
    walked = [
        r
        for r in walk(reader, salt, start.epoch, lambda at, to: holes.append((at, to)))
        if r[1].kind != Kind.REGION
    ]
    good = []
    for offset, header in walked:
        report.records += 1
        report.bytes_read += header.record_bytes
        if header.kind == Kind.DATA and not payload_intact(reader, offset, header):
            report.damage.append(f"{where} offset {offset}: {_damaged(header, values)}")
            if fix:
                invalidate(reader, offset)
                report.fixed += 1
            continue
        good.append((offset, header))
    footer, problem = inspect_footer(reader, salt, start.epoch)
    if problem is not None:
        report.damage.append(f"{where}: {problem}")
    walked_rows = [row_of(offset, header) for offset, header in walked]
    good_rows = [row_of(offset, header) for offset, header in good]
    if footer:
        _compare(footer, walked_rows, where, report, values)
    else:
        report.footers_missing += problem is None
        # Without a footer no hole is explained (by a write that failed before it was
        # indexed, which a footer leaves out): each is damage.
        report.damage.extend(f"{where}: bytes {at}..{to} hold no valid record" for at, to in holes)
        end = max([PAGE_BYTES] + [o + h.record_bytes for o, h in walked] + [t for _, t in holes])
        if _damaged_header_at(reader, salt, start.epoch, end):
            report.damage.append(
                f"{where}: bytes {end}..{end + PAGE_BYTES} hold a damaged record header (the "
                "region's last record, or bytes an older filling left that look like one)"
            )
    if fix and rebuilt:
        rewrite_start(reader, superblock, start)
        report.fixed += 1
    needs_footer = (footer != good_rows or problem is not None) and good
    if fix and needs_footer and write_footer(reader, salt, start.epoch, good):
        report.fixed += 1
    return [header for _, header in good]


def _damaged_header_at(reader: RegionReader, salt: int, epoch: int, offset: int) -> bool:
    """Whether the page at ``offset``, just past the last record a walk of a region without a
    footer found, looks like a record header (its magic, give or take a byte) but is no valid
    header of this filling or an older one: a damaged last record, which no later header makes
    a hole of."""
    if offset + PAGE_BYTES > reader.region_bytes - TRAILER_BYTES:
        return False
    page = reader.page(offset)
    if sum(a == b for a, b in zip(bytes(page[:8]), RECORD_MAGIC, strict=True)) < 7:
        return False
    header = unpack_header(page, salt)
    return header is None or header.epoch > epoch


def _start(
    reader: RegionReader, salt: int, where: str, report: CheckReport
) -> tuple[RecordHeader | None, bool]:
    """The region's start record (None for a free region), and whether it was rebuilt: one
    whose first page is damaged is reported, and stood in for by what its records still say
    of its filling."""
    first = first_header(reader, salt)
    if first is not None or not any(reader.page(0, read_ahead=False)):
        return first, False
    filling = damaged_filling(reader, salt)
    if filling is None:
        report.damage.append(f"{where}: its first page is damaged, and nothing in it verifies")
        return None, False
    report.damage.append(
        f"{where}: its start record (its first page) is damaged; its records still verify"
    )
    tenants = sorted(filling.tenants)
    pool = tenants[0] if len(tenants) == 1 else ""  # a recovery maps it to its pool
    return RecordHeader(Kind.REGION, 0, pool, "", 0, epoch=filling.epoch), True


def _compare(
    footer: list[FooterRow],
    walked: list[FooterRow],
    where: str,
    report: CheckReport,
    values: ValueObserver,
) -> None:
    """A valid footer against the records a walk found: a record it lists whose header the
    walk could not read is that object's damage; a record it does not list is the footer's."""
    found = {row[0] for row in walked}
    for row in footer:
        if row[0] not in found:
            named = _named(row, values)
            report.damage.append(f"{where} offset {row[0]}: {named}: its header is damaged")
    listed = set(footer)
    unlisted = [row for row in walked if row not in listed]
    if unlisted:
        report.footers_wrong += 1
        report.damage.append(
            f"{where}: its footer does not list {len(unlisted)} record(s) found at offsets "
            f"{', '.join(str(row[0]) for row in unlisted[:8])}"
        )


def _superblock(
    database: int, path: str, device: FileDevice, region_bytes: int, fix: bool, report: CheckReport
) -> Superblock:
    """The database's superblock; one read from a region's copy is damage (rewritten with
    ``fix``)."""
    found = read_superblock(device, region_bytes)
    if found is None:
        raise StartupError(
            f"{path} has no valid superblock, nor a copy of one in its regions (at region_size "
            f"{region_bytes}): it is not a formatted database, or not at this region_size"
        )
    if found.copy_region is not None:
        report.damage.append(
            f"database {database} ({path}): its superblock is damaged (region "
            f"{found.copy_region}'s start record keeps an intact copy)"
        )
        if fix:
            write_superblock(device, found.superblock)
            report.fixed += 1
    return found.superblock


class ProgressLine:
    """A progress bar on stderr (tqdm): regions checked, bytes read, damage found so far."""

    def __init__(self) -> None:
        self._bar: tqdm[Never] | None = None

    def __call__(self, report: CheckReport, done: int, total: int) -> None:
        if self._bar is None:
            self._bar = tqdm(total=total, desc="checking", unit="region", mininterval=1.0)
        bar = self._bar
        bar.set_postfix_str(
            f"{format_size(report.bytes_read)} read, {len(report.damage)} damaged", refresh=False
        )
        bar.update(done - bar.n)
        if done == total:
            bar.close()


def _named(row: FooterRow, values: ValueObserver) -> str:
    """The value a footer row lists, as an operator names it."""
    kind, tenant, key = row[1], row[3], row[4]
    if kind != Kind.DATA:
        return f"a tombstone of {tenant}/{key}"
    return values.named(tenant, key)


def _damaged(header: RecordHeader, values: ValueObserver) -> str:
    """What a record whose payload fails its checksum holds, as an operator names it."""
    return f"{values.named(header.tenant, header.key)}: payload fails its checksum"
