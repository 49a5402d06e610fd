"""``adp-gateway check [--fix]``: walk every record of every database and verify it.

Reads each region header by header (never trusting its footer), verifies every payload checksum,
and compares what it found with the region's footer. It reports damaged records (a payload that
fails its checksum), damaged areas (bytes between records that hold no valid header: a torn or
failed write), and footers that are missing or disagree with the records. With ``--fix`` it
invalidates damaged records (zeroes their header, so no recovery believes them) and rewrites
the footer of every region whose footer was missing, wrong or listed a damaged record, so the
index a restart rebuilds matches the disk. It takes the same lock as the gateway: it refuses to
run while a gateway uses the databases.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Never

from tqdm import tqdm

from adp_gateway.card.software.devices.filedevice import FileDevice, open_existing
from adp_gateway.card.software.devices.reader import RegionReader
from adp_gateway.card.software.recovery import (
    first_header,
    invalidate,
    payload_intact,
    read_footer,
    walk,
)
from adp_gateway.card.software.sealing import row_of, write_footer
from adp_gateway.card.software.superblocks import read_superblock, write_superblock
from adp_gateway.errors import StartupError
from adp_gateway.format import Kind, RecordHeader
from adp_gateway.objects.names import Version, parse
from adp_wire.ring.layout import PAGE_BYTES
from adp_wire.units import format_size


@dataclass
class Report:
    databases: int = 0
    regions: int = 0
    records: int = 0
    bytes_read: int = 0
    objects: int = 0  # whole: every fragment's record found (adp_gateway/objects/names.py)
    foreign: int = 0  # records of values that are no object's fragment (an older layout)
    damage: list[str] = field(default_factory=list)
    footers_missing: int = 0
    footers_wrong: int = 0
    fixed: int = 0

    def summary(self) -> str:
        return (
            f"checked {self.databases} database(s), {self.regions} region(s) in use: "
            f"{self.records} records ({format_size(self.bytes_read)} read), {self.objects} "
            f"complete objects{self._foreign()}; {len(self.damage)} damaged; "
            f"{self.footers_missing} region(s) "
            f"without a footer, {self.footers_wrong} with a wrong one; {self.fixed} repair(s)"
        )

    def _foreign(self) -> str:
        return f", {self.foreign} values of an older layout" if self.foreign else ""


def check(
    paths: list[str],
    fix: bool,
    progress: Callable[[Report, int, int], None],
    region_bytes: int,
) -> Report:
    """Check the databases at ``paths``; ``region_bytes`` (the config's) locates the regions'
    copies of a damaged superblock."""
    report = Report()
    devices = [open_existing(path) for path in paths]
    try:
        geometry = [
            _superblock(database, path, device, region_bytes, fix, report)
            for database, (path, device) in enumerate(zip(paths, devices, strict=True))
        ]
        total = sum(count for count, _, _ in geometry)
        done = 0
        fragments: dict[tuple[str, str, Version], set[int]] = defaultdict(set)
        for database, (device, (count, region_bytes, salt)) in enumerate(
            zip(devices, geometry, strict=True)
        ):
            report.databases += 1
            for region in range(count):
                reader = RegionReader(device, PAGE_BYTES + region * region_bytes, region_bytes)
                where = f"database {database} ({paths[database]}) region {region}"
                for header in _check_region(reader, salt, where, fix, report):
                    fragment = parse(header.key) if header.kind == Kind.DATA else None
                    if fragment is not None:
                        version = (header.tenant, fragment.key, fragment.version)
                        fragments[version].add(fragment.place)
                    elif header.kind == Kind.DATA:
                        report.foreign += 1
                done += 1
                progress(report, done, total)
        report.objects = sum(len(found) == v[2].fragments for v, found in fragments.items())
        if fix:
            for device in devices:
                device.sync()
        return report
    finally:
        for device in devices:
            device.close()


def _check_region(
    reader: RegionReader, salt: int, where: str, fix: bool, report: Report
) -> list[RecordHeader]:
    """The region's valid records; damage and footer problems go into ``report``."""
    first = first_header(reader, salt)
    if first is None:
        return []
    report.regions += 1

    holes: list[str] = []

    def hole(at: int, resumed: int) -> None:
        holes.append(f"{where}: bytes {at}..{resumed} hold no valid record")

    walked = [r for r in walk(reader, salt, first.epoch, hole) if r[1].kind != Kind.REGION]
    good = []
    for offset, header in walked:
        report.records += 1
        report.bytes_read += header.record_bytes
        if header.kind == Kind.DATA and not payload_intact(reader, offset, header):
            report.damage.append(f"{where} offset {offset}: {_damaged(header)}")
            if fix:
                invalidate(reader, offset)
                report.fixed += 1
            continue
        good.append((offset, header))
    footer = read_footer(reader, salt, first.epoch)
    walked_rows = [row_of(offset, header) for offset, header in walked]
    good_rows = [row_of(offset, header) for offset, header in good]
    if not footer:
        report.footers_missing += 1
    elif footer != walked_rows:
        report.footers_wrong += 1
        report.damage.append(f"{where}: its footer does not list the records found")
    if footer != good_rows:
        # A hole that a valid footer leaves out is a write that failed before it was indexed
        # (or a record an earlier --fix invalidated); any other is damage.
        report.damage.extend(holes)
    needs_footer = footer != good_rows
    if fix and needs_footer and good and write_footer(reader, salt, first.epoch, good):
        report.fixed += 1
    return [header for _, header in good]


def _superblock(
    database: int, path: str, device: FileDevice, region_bytes: int, fix: bool, report: Report
) -> tuple[int, int, int]:
    """(regions, region_bytes, salt) of a formatted database; a damaged superblock read from
    a region's copy is damage (rewritten with ``fix``)."""
    found = read_superblock(device, region_bytes)
    if found is None:
        raise StartupError(
            f"{path} has no valid superblock, nor a copy of one in its regions (at region_size "
            f"{region_bytes}): it is not a formatted database, or not at this region_size"
        )
    superblock = found.superblock
    if found.copy_region is not None:
        report.damage.append(
            f"database {database} ({path}): its superblock is damaged (region "
            f"{found.copy_region}'s start record keeps an intact copy)"
        )
        if fix:
            write_superblock(device, superblock)
            report.fixed += 1
    regions = (device.size_bytes - PAGE_BYTES) // superblock.region_bytes
    return regions, superblock.region_bytes, superblock.salt


class ProgressLine:
    """A progress bar on stderr (tqdm): regions checked, bytes read, damage found so far."""

    def __init__(self) -> None:
        self._bar: tqdm[Never] | None = None

    def __call__(self, report: Report, done: int, total: int) -> None:
        if self._bar is None:
            self._bar = tqdm(total=total, desc="checking", unit="region", mininterval=1.0)
        bar = self._bar
        bar.set_postfix_str(
            f"{format_size(report.bytes_read)} read, {len(report.damage)} damaged", refresh=False
        )
        bar.update(done - bar.n)
        if done == total:
            bar.close()


def _damaged(header: RecordHeader) -> str:
    """What a record whose payload fails its checksum holds, as an operator names it."""
    fragment = parse(header.key)
    if fragment is None:
        return f"{header.tenant}/{header.key}: payload fails its checksum (an older layout)"
    what = f"{header.tenant}/{fragment.key} fragment {fragment.place}"
    return f"{what}: payload fails its checksum (version {fragment.version.number})"
