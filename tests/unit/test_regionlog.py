"""Goal: the region log appends, reads back, reclaims whole regions oldest first, and a scan after
a restart finds exactly the live records, skipping torn ones. Runs on every device kind."""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from adp_gateway.card.software import records
from adp_gateway.card.software.devices.base import Device
from adp_gateway.card.software.devices.faulty import FaultyDevice
from adp_gateway.card.software.devices.memory import MemoryDevice
from adp_gateway.card.software.devices.reader import RegionReader, aligned
from adp_gateway.card.software.format import Kind, RecordHeader, unpack_header, unpack_superblock
from adp_gateway.card.software.recovery import first_header, read_footer, walk
from adp_gateway.card.software.regionlog import RegionLog
from adp_gateway.card.software.sealing import row_of
from adp_gateway.errors import StartupError, StorageError
from adp_wire.checksum import checksum
from tests.support.storage import REGION, extent, make_devices, payload

SIZE = 4096 + 4 * REGION  # superblock + four regions
ZEROS = bytes(8192)


def scanned_seqs(log: RegionLog) -> list[int]:
    """The seq of every record a recovery scan finds, in scan order."""
    return [row[2] for found in log.scan() for row in found.rows]


def header(seq: int, size: int, data: bytes | memoryview) -> RecordHeader:
    """The header of a record of ``size`` bytes of ``data``, with its payload checksum."""
    checked = checksum(data[:size])
    return RecordHeader(Kind.DATA, seq, "t", f"k{seq}", size, 0, size, payload_checksum=checked)


@pytest.fixture(params=["memory", "file"])
def devices(request: pytest.FixtureRequest, tmp_path: Path) -> list[Device]:
    return make_devices(request.param, tmp_path, 1, SIZE)


def test_append_then_read(devices: list[Device]) -> None:
    log = RegionLog(devices, REGION, lambda *r: [])
    data = payload(1, 10000)
    location = log.append(0, header(1, 10000, data), extent(data))
    out = extent(bytes(10000))
    found = log.read(location, out)
    assert found is not None and found.key == "k1" and found.epoch == location.epoch
    assert bytes(out[:10000]) == data


def test_full_log_reclaims_the_oldest_region_first(devices: list[Device]) -> None:
    reclaimed: list[tuple[int, int, int]] = []
    log = RegionLog(devices, REGION, lambda *r: reclaimed.append(r) or [])
    record = extent(payload(2, 60 * 2**10))
    locations = [log.append(0, header(i, 60 * 2**10, record), record) for i in range(40)]
    assert log.used_bytes <= log.capacity_bytes
    first_regions = [loc.region for loc in locations[:12]]
    assert [r[1] for r in reclaimed[:3]] == sorted(set(first_regions))[:3]
    assert reclaimed[0][2] == locations[0].epoch
    assert log.read(locations[0], None) is None  # overwritten: the epoch no longer matches
    assert log.read(locations[-1], None) is not None


def test_scan_after_restart_finds_live_records_only(devices: list[Device]) -> None:
    log = RegionLog(devices, REGION, lambda *r: [])
    record = extent(payload(3, 50 * 2**10))
    for i in range(30):  # wraps around: early regions are reused with new epochs
        log.append(0, header(i, 50 * 2**10, record), record)
    reopened = RegionLog(devices, REGION, lambda *r: [])
    seqs = sorted(scanned_seqs(reopened))
    assert seqs == list(range(seqs[0], 30))  # a contiguous, newest run: nothing stale
    assert len(seqs) >= 12


def test_scan_skips_a_torn_record_and_keeps_later_ones() -> None:
    device = MemoryDevice(SIZE)
    log = RegionLog([device], REGION, lambda *r: [])
    record = extent(payload(4, 8192))
    locations = [log.append(0, header(i, 8192, record), record) for i in range(5)]
    device.corrupt(locations[2].offset + 100)  # tear the header of record 2
    found = scanned_seqs(RegionLog([device], REGION, lambda *r: []))
    assert found == [0, 1, 3, 4]


def test_a_record_whose_payload_was_torn_is_dropped_by_the_walk_and_invalidated() -> None:
    # A crash mid-write (a SIGKILL while the kernel pins the source pages, or power) can leave a
    # record's header on disk without all of its payload. The header is valid, so only the
    # payload checksum tells: the walk of the region open at the crash must drop the record,
    # or the key is found by EXISTS and then missed by every load.
    device = MemoryDevice(SIZE)
    log = RegionLog([device], REGION, lambda *r: [])
    record = extent(payload(5, 8192))
    locations = [log.append(0, header(i, 8192, record), record) for i in range(5)]
    device.corrupt(locations[2].offset + 4096 + 100)  # a byte of record 2's payload
    assert scanned_seqs(RegionLog([device], REGION, lambda *r: [])) == [0, 1, 3, 4]
    reader = RegionReader(device, 0, SIZE)
    assert unpack_header(reader.page(locations[2].offset), log.salt(0)) is None
    # The footer written by that walk lists the same records, and is what the next start reads.
    assert scanned_seqs(RegionLog([device], REGION, lambda *r: [])) == [0, 1, 3, 4]


def test_changed_region_size_is_refused(devices: list[Device]) -> None:
    RegionLog(devices, REGION, lambda *r: [])
    with pytest.raises(StartupError, match="region_size"):
        RegionLog(devices, REGION // 2, lambda *r: [])


def test_a_filesystem_without_o_direct_falls_back_to_buffered_io(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import errno
    import os

    from adp_gateway.card.software.devices import filedevice

    real_open = os.open

    def refuse_o_direct(path: str, flags: int, *args: int) -> int:
        if flags & os.O_DIRECT:  # what ext4 on some overlays or FUSE answer
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(filedevice.os, "open", refuse_o_direct)
    device = filedevice.FileDevice(str(tmp_path / "db0.adp"), SIZE)
    assert device.direct is False
    assert "refuses O_DIRECT; using buffered I/O" in caplog.text
    log = RegionLog([device], REGION, lambda *r: [])
    data = payload(5, 5000)
    location = log.append(0, header(1, 5000, data), extent(data))
    out = extent(bytes(5000))
    assert log.read(location, out) is not None and bytes(out[:5000]) == data


class CountingDevice(MemoryDevice):
    """Counts reads, to tell a footer read from a header walk."""

    def __init__(self, size_bytes: int) -> None:
        super().__init__(size_bytes)
        self.reads = 0

    def read(self, buffers: list[memoryview], offset: int) -> None:
        self.reads += 1
        super().read(buffers, offset)


def fill(log: RegionLog, count: int, size: int = 4096) -> list[int]:
    record = extent(payload(6, size))
    return [log.append(0, header(i, size, record), record).region for i in range(count)]


def test_sealed_regions_are_recovered_from_their_footer_in_three_reads() -> None:
    device = CountingDevice(SIZE)
    regions = fill(RegionLog([device], REGION, lambda *r: []), 100)  # 8 KiB records
    sealed = len(set(regions)) - 1  # the last region is still open
    assert sealed >= 2
    device.reads = 0
    found = scanned_seqs(RegionLog([device], REGION, lambda *r: []))
    assert found == list(range(100))
    # superblock + per region: first page, trailer page, footer; the open region is walked.
    walked_reads = device.reads - 1 - 3 * sealed
    assert 0 < walked_reads <= 4
    device.reads = 0
    again = scanned_seqs(RegionLog([device], REGION, lambda *r: []))
    assert again == found  # the walk sealed the open region: now read from its footer too
    assert device.reads <= 1 + 3 * (sealed + 1) + 1


def test_a_damaged_footer_costs_a_walk_never_a_record() -> None:
    device = MemoryDevice(SIZE)
    log = RegionLog([device], REGION, lambda *r: [])
    fill(log, 60)
    trailer_at = 4096 + REGION - 4096  # region 0's trailer
    device.corrupt(trailer_at + 40)
    found = scanned_seqs(RegionLog([device], REGION, lambda *r: []))
    assert found == list(range(60))


def test_footers_agree_with_a_header_walk_after_wrapping_around() -> None:
    """After the log has wrapped around its regions several times and closed (sealing every
    region), each region's footer lists exactly the records a header-by-header walk finds."""
    devices = [MemoryDevice(SIZE)]
    log = RegionLog(devices, REGION, lambda *r: [])
    fill(log, 300, size=20_000)  # several times the capacity
    log.close()
    page = aligned(4096)
    devices[0].read([page], 0)
    superblock = unpack_superblock(page)
    assert superblock is not None
    compared = 0
    for region in range((SIZE - 4096) // REGION):
        reader = RegionReader(devices[0], 4096 + region * REGION, REGION)
        first = first_header(reader, superblock.salt)
        assert first is not None  # every region was filled at least once
        footer = read_footer(reader, superblock.salt, first.epoch)
        walked = [
            row_of(offset, header)
            for offset, header in walk(reader, superblock.salt, first.epoch, _no_hole)
            if header.kind != Kind.REGION
        ]
        assert footer and footer == walked, f"region {region}"
        compared += len(walked)
    assert compared >= 8  # the footers listed records, and the walk found the same ones


def _no_hole(at: int, resumed: int) -> None:
    raise AssertionError(f"a hole at {at}..{resumed} in a log nothing damaged")


def test_eviction_spares_recently_read_regions() -> None:
    log = RegionLog([MemoryDevice(SIZE)], REGION, lambda *r: [])
    record = extent(payload(7, 60 * 2**10))
    hot = log.append(0, header(0, 60 * 2**10, record), record)
    for i in range(1, 60):  # about four times the capacity
        log.append(0, header(i, 60 * 2**10, record), record)
        assert log.read(hot, None) is not None, f"the hot record was evicted at append {i}"


def test_eviction_reclaims_emptied_regions_first() -> None:
    reclaimed: list[tuple[int, int, int]] = []
    log = RegionLog([MemoryDevice(SIZE)], REGION, lambda *r: reclaimed.append(r) or [])
    record = extent(payload(8, 60 * 2**10))
    locations = [
        log.append(0, header(i, 60 * 2**10, record), record) for i in range(12)
    ]  # 4 regions
    assert not reclaimed
    for location in locations:
        log.retain((location,))
    emptied = locations[4].region  # not the oldest region
    assert emptied != locations[0].region
    for location in locations:
        if location.region == emptied:
            log.release((location,))
    for i in range(12, 16):
        log.append(0, header(i, 60 * 2**10, record), record)
    assert reclaimed[0][1] == emptied


class GatedDevice:
    """A memory device that records its writes and holds any write starting at ``held_offset``
    until released: a slow first write of a region."""

    def __init__(self, size: int) -> None:
        self.inner = MemoryDevice(size)
        self.writes: list[tuple[int, int]] = []  # (offset, bytes), as they land
        self.held_offset = -1
        self.holding = threading.Event()
        self.release = threading.Event()

    @property
    def size_bytes(self) -> int:
        return self.inner.size_bytes

    def write(self, buffers: list[memoryview], offset: int) -> None:
        if offset == self.held_offset:
            self.holding.set()
            assert self.release.wait(10), "a held write was never released"
        self.inner.write(buffers, offset)
        self.writes.append((offset, sum(len(b) for b in buffers)))

    def read(self, buffers: list[memoryview], offset: int) -> None:
        self.inner.read(buffers, offset)

    def sync(self) -> None:
        self.inner.sync()

    def close(self) -> None:
        self.inner.close()


def in_thread(work: Callable[[], object]) -> threading.Event:
    """Run ``work`` in a thread; the event is set when it returns."""
    done = threading.Event()

    def run() -> None:
        work()
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done


def test_a_region_is_opened_by_its_first_write_not_by_a_write_of_its_own() -> None:
    """The start record (the filling's epoch) travels in front of the first record, in one
    write at the region's start: opening a region costs no I/O of its own."""
    device = GatedDevice(SIZE)
    log = RegionLog([device], REGION, lambda *r: [])
    device.writes.clear()  # the formatting
    data = payload(5, 8192)
    location = log.append(0, header(1, 8192, data), extent(data))
    region_start = location.offset - 4096
    assert device.writes == [(region_start, 4096 + 4096 + 8192)]
    page = extent(bytes(4096))
    device.read([page], region_start)
    first = unpack_header(page, log.salt(0))
    assert first is not None and first.kind == Kind.REGION and first.epoch == location.epoch


def test_nothing_of_a_filling_is_written_before_its_first_page() -> None:
    """A record reserved behind a region's slow first write (which names the new filling) is
    not written before that first write has landed: until then the region's first page names
    the old filling, whose footer a crash would have recovery believe over whatever had been
    overwritten; nor is it reported written, so not synced nor acknowledged."""
    device = GatedDevice(SIZE)
    log = RegionLog([device], REGION, lambda *r: [])
    device.held_offset = 4096  # region 0's start, the first write of its first filling
    device.writes.clear()  # the formatting
    first_done = in_thread(lambda: log.append(0, header(1, 8192, ZEROS), extent(ZEROS)))
    assert device.holding.wait(10)
    second_done = in_thread(lambda: log.append(0, header(2, 8192, ZEROS), extent(ZEROS)))
    assert not second_done.wait(0.5)  # it waits for the region's first write...
    assert device.writes == []  # ...and wrote nothing meanwhile
    device.release.set()
    assert first_done.wait(10) and second_done.wait(10)
    assert device.writes[0][0] == 4096  # the first page went first
    assert sorted(scanned_seqs(RegionLog([device], REGION, lambda *r: []))) == [1, 2]


def test_a_slow_region_opening_holds_up_no_other_database() -> None:
    """No lock is held across I/O: while one database's first write into a region is stuck,
    appends to another database go on."""
    slow, other = GatedDevice(SIZE), GatedDevice(SIZE)
    log = RegionLog([slow, other], REGION, lambda *r: [])
    slow.held_offset = 4096
    stuck_done = in_thread(lambda: log.append(0, header(1, 8192, ZEROS), extent(ZEROS)))
    assert slow.holding.wait(10)
    done = in_thread(lambda: log.append(1, header(2, 8192, ZEROS), extent(ZEROS)))
    assert done.wait(10), "an append to database 1 waited for database 0's write"
    assert not stuck_done.is_set()
    slow.release.set()
    assert stuck_done.wait(10)


def test_a_failed_first_write_leaves_nothing_of_its_filling_and_frees_the_region() -> None:
    """A filling whose first write failed holds no record a recovery would find; the region is
    free again and the next append starts a new filling there."""
    device = FaultyDevice(MemoryDevice(SIZE))
    log = RegionLog([device], REGION, lambda *r: [])
    device.fail("write", errno.EIO)
    with pytest.raises(StorageError):
        log.append(0, header(1, 8192, ZEROS), extent(ZEROS))
    location = log.append(0, header(2, 8192, ZEROS), extent(ZEROS))
    assert location.region == 0 and log.read(location, None) is not None
    assert scanned_seqs(RegionLog([device.inner], REGION, lambda *r: [])) == [2]


def test_a_region_whose_first_write_failed_is_counted_free_and_filled_in_its_turn() -> None:
    """The filling given up uses no bytes, and the region is not ranked as the oldest victim
    for ever: the log fills all four regions before it reclaims one, and reclaims them in
    turn."""
    device = FaultyDevice(MemoryDevice(SIZE))
    reclaimed: list[int] = []
    log = RegionLog([device], REGION, lambda _db, region, _epoch: reclaimed.append(region) or [])
    device.fail("write", errno.EIO)
    with pytest.raises(StorageError):
        log.append(0, header(1, 8192, ZEROS), extent(ZEROS))
    assert log.used_bytes == 0
    for seq in range(2, 400):
        log.append(0, header(seq, 8192, ZEROS), extent(ZEROS))
    assert len(reclaimed) > 8 and all(
        sorted(reclaimed[i : i + 4]) == [0, 1, 2, 3] for i in range(0, len(reclaimed) - 3, 4)
    )


def test_an_append_waiting_for_a_stuck_first_write_gives_up_at_its_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A record placed in a region whose first write (another thread's) the disk holds waited
    for that write for ever; now it gives up after FIRST_WRITE_WAIT_S, unwritten, and its
    append fails (the op fails; the other thread's records are not affected)."""
    monkeypatch.setattr(records, "FIRST_WRITE_WAIT_S", 0.3, raising=False)
    device = FaultyDevice(MemoryDevice(SIZE))
    log = RegionLog([device], REGION, lambda *r: [])
    data = payload(7, 4096)
    device.delay_s = 3.0  # the region's first write sleeps 3 s, like a disk that hangs
    first_done: list[object] = []
    first = threading.Thread(
        target=lambda: first_done.append(log.append(0, header(1, 4096, data), extent(data)))
    )
    first.start()
    time.sleep(0.2)  # the first append has reserved its region and is inside its write
    started = time.monotonic()
    with pytest.raises(StorageError, match="first write"):
        log.append(0, header(2, 4096, data), extent(data))
    assert time.monotonic() - started < 2.0
    first.join(30)
    assert first_done, "the first append should still land"
