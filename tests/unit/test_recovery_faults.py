"""Goal: a fault costs what it touched, never more, and never returns stale bytes. A filling
whose start record a power cut lost never has its epoch handed out again, so its leftover
records cannot outlive a newer, synced value; a page the device fails to read at start-up
costs the records in it, not the rest of its region (whether it held the region's footer, its
start record or a record's payload), and a region it cannot read at all its own records, not
the gateway's start; a corrupt value whose tombstone cannot be
written is a miss, and the other values of the same read load; a database whose sync fails
does not keep the others' writes from being made durable; and a region whose only record was
torn keeps its start record after a restart."""

from __future__ import annotations

import errno
import logging
from collections.abc import Sequence

import pytest

from adp_gateway.card.base import Value, Wanted
from adp_gateway.card.software.card import SoftwareCard
from adp_gateway.card.software.devices.faulty import FaultyDevice
from adp_gateway.card.software.devices.memory import MemoryDevice
from adp_gateway.card.software.devices.reader import aligned
from adp_gateway.card.software.format import RECORD_MAGIC
from adp_gateway.errors import StorageError
from tests.support.storage import REGION, extent, open_card, payload

SIZE = 4096 + 4 * REGION
LENGTH = 10_000


def put(card: SoftwareCard, name: str, fill: int, database: int = 0) -> bytes:
    data = payload(fill, LENGTH)
    card.put("t", [Value(database, name, extent(data), LENGTH)])
    return data


def get(card: SoftwareCard, names: Sequence[str]) -> list[bytes | None]:
    buffers = [extent(bytes(LENGTH)) for _ in names]
    found = card.get("t", [Wanted(n, b, LENGTH) for n, b in zip(names, buffers, strict=True)])
    return [bytes(b[:LENGTH]) if ok else None for ok, b in zip(found, buffers, strict=True)]


class Fates:
    """The fates a power cut gives the unsynced writes, newest first (FaultyDevice.power_loss)."""

    def __init__(self, *fates: str) -> None:
        self._fates = list(fates)

    def choice(self, options: Sequence[str]) -> str:
        return self._fates.pop(0)

    def randrange(self, *bounds: int) -> int:
        return 0


def test_a_filling_whose_start_record_a_power_cut_lost_never_outlives_a_newer_value() -> None:
    """The cut keeps the region's second write (N = X) and loses its first (the start record
    and "a"). The next run refills the region and syncs N = Y; after a crash, N is Y."""
    memory = MemoryDevice(SIZE)
    device = FaultyDevice(memory)
    card = open_card([device], sync=False)
    card.recover()
    put(card, "a", 1)
    stale = put(card, "N", 2)
    device.power_loss(Fates("kept", "lost"))  # type: ignore[arg-type]

    card = open_card([FaultyDevice(memory)], sync=False)
    card.recover()
    newer = put(card, "N", 3)
    card.sync_all()  # acknowledged and durable; then a crash, no close

    card = open_card([memory], sync=False)
    card.recover()
    assert get(card, ["N"]) == [newer] != [stale]


class BadSectors(MemoryDevice):
    """A memory device whose bytes in ``bad`` cannot be read (EIO)."""

    bad = range(0)

    def read(self, buffers: list[memoryview], offset: int) -> None:
        if self.bad and offset < self.bad.stop and self.bad.start < offset + sum(map(len, buffers)):
            raise OSError(errno.EIO, "medium error")
        super().read(buffers, offset)


def filled(sealed: bool) -> tuple[BadSectors, dict[str, bytes], SoftwareCard]:
    """A database of two regions and more of values; closed (every region sealed: a restart
    reads their footers) or left as a kill leaves it (a restart walks the open one)."""
    device = BadSectors(SIZE)
    card = open_card([device])
    card.recover()
    values = {f"k{i}": put(card, f"k{i}", i) for i in range(30)}
    if sealed:
        card.close()
    return device, values, card


def region_of(card: SoftwareCard, name: str) -> int:
    return card.index.get(("t", name)).locations[0].region  # type: ignore[union-attr]


@pytest.mark.parametrize("where", ["footer", "start-record", "payload"])
def test_a_page_the_device_cannot_read_at_start_up_costs_only_the_records_in_it(
    where: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The page reads as zeros, which no record verifies: a footer that does not verify has the
    region walked, a start record that does not has it rebuilt from the records behind it, and
    a record whose payload does not is left out, yet not invalidated on the device (a read error
    is not damage)."""
    device, values, card = filled(sealed=where != "payload")
    in_open = [n for n in values if region_of(card, n) == region_of(card, "k29")]
    lost = in_open[0] if where == "payload" else None
    if lost is not None:  # its region open, walked at the restart
        at = card.index.get(("t", lost)).locations[0].offset + 4096 + 5  # type: ignore[union-attr]
    else:
        at = 4096 + (REGION - 100 if where == "footer" else 100)  # region 0
    device.bad = range(at, at + 1)

    card = open_card([device])
    with caplog.at_level(logging.WARNING):
        card.recover()
    assert "1 page(s) could not be read at start-up" in caplog.text
    assert get(card, list(values)) == [None if n == lost else v for n, v in values.items()]
    if lost is not None:
        device.bad = range(0)
        header = aligned(4096)
        device.read([header], at - 4096 - 5)
        assert bytes(header[:8]) == RECORD_MAGIC


def test_a_region_the_device_cannot_read_at_all_costs_its_own_records_only() -> None:
    device, values, card = filled(sealed=True)
    in_first = {n for n in values if region_of(card, n) == 0}
    assert in_first and in_first != set(values)
    device.bad = range(4096, 4096 + REGION)  # region 0

    card = open_card([device])
    card.recover()
    assert get(card, list(values)) == [None if n in in_first else v for n, v in values.items()]
    device.bad = range(0)
    assert put(card, "new", 99) and get(card, ["new"]) == [payload(99, LENGTH)]


def test_a_corrupt_value_whose_tombstone_cannot_be_written_is_a_miss_beside_good_ones() -> None:
    memory = MemoryDevice(SIZE)
    device = FaultyDevice(memory)
    card = open_card([device, MemoryDevice(SIZE)])
    card.recover()
    put(card, "bad", 1)
    good = put(card, "good", 2, database=1)
    location = card.index.get(("t", "bad")).locations[0]  # type: ignore[union-attr]
    memory.corrupt(location.offset + 4096 + 5)  # a flipped byte of its payload
    device.fail("write", errno.ENOSPC, count=5)  # the tombstone cannot be written
    assert get(card, ["good", "bad"]) == [good, None]
    assert get(card, ["bad"]) == [None]


class FailingSync(MemoryDevice):
    broken = False

    def sync(self) -> None:
        if self.broken:
            raise OSError(errno.EIO, "fdatasync failed")
        super().sync()


def test_a_failed_sync_of_one_database_does_not_keep_the_others_from_syncing() -> None:
    first, second = FailingSync(SIZE), MemoryDevice(SIZE)
    card = open_card([first, second], sync=False)
    card.recover()
    first.broken = True
    put(card, "on-first", 1)
    put(card, "on-second", 2, database=1)
    synced = second.syncs
    with pytest.raises(StorageError, match="sync of database 0"):
        card.sync_all()
    assert second.syncs > synced


def test_the_card_gives_one_sync_per_database_each_syncing_its_own() -> None:
    """What the periodic clock runs on threads of their own (scheduling/periodic_sync.py)."""
    first, second = MemoryDevice(SIZE), MemoryDevice(SIZE)
    card = open_card([first, second], sync=False)
    card.recover()
    put(card, "on-first", 1)
    put(card, "on-second", 2, database=1)
    synced = first.syncs, second.syncs
    first_sync, second_sync = card.syncs()
    second_sync()
    assert (first.syncs, second.syncs) == (synced[0], synced[1] + 1)
    first_sync()
    assert (first.syncs, second.syncs) == (synced[0] + 1, synced[1] + 1)


def test_a_region_whose_only_record_was_torn_keeps_its_start_record(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The first write lands its start record and the record's header, not its payload: the
    restart drops the record, and writes no footer over the start record, so the one after it
    finds nothing damaged."""
    memory = MemoryDevice(SIZE)
    device = FaultyDevice(memory)
    card = open_card([device])
    card.recover()
    device.tear_next_write(8192)
    with pytest.raises(StorageError):
        put(card, "k", 1)
    open_card([memory]).recover()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        open_card([memory]).recover()
    assert "damaged" not in caplog.text
