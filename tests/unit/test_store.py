"""Goal: the store never returns wrong bytes, survives restarts with a consistent index, keeps
within its capacity and honours deletes, on every device kind and with several databases."""

from __future__ import annotations

import errno
import threading
import time
from pathlib import Path

import pytest

from adp_gateway.card.base import Value
from adp_gateway.card.software.card import SoftwareCard
from adp_gateway.card.software.devices.base import Device
from adp_gateway.card.software.devices.memory import MemoryDevice
from adp_gateway.card.software.regionlog import RegionLog
from adp_gateway.card.software.values import ValueIO
from tests.support.storage import (
    REGION,
    extent,
    locations,
    make_devices,
    open_store,
    payload,
    software_card,
)

SIZE = 4096 + 8 * REGION


@pytest.fixture(params=[("memory", 1), ("file", 1), ("file", 2)], ids=["mem", "file", "file2"])
def devices(request: pytest.FixtureRequest, tmp_path: Path) -> list[Device]:
    kind, count = request.param
    return make_devices(kind, tmp_path, count, SIZE)


def read(store: object, key: str, size: int) -> bytes | None:
    out = extent(bytes(size))
    return bytes(out[:size]) if store.get("t", key, out, size) else None  # type: ignore[attr-defined]


@pytest.mark.parametrize("size", [1, 4095, 4096, 100_003, 200 * 2**10])
def test_round_trip_of_odd_and_multi_fragment_sizes(devices: list[Device], size: int) -> None:
    store = open_store(devices)
    data = payload(size, size)
    store.put("t", "k", extent(data), size)
    assert store.exists("t", ["k", "other"]) == [True, False]
    assert read(store, "k", size) == data
    assert read(store, "k", size + 1) is None  # a length mismatch is a miss


def test_restart_rebuilds_the_index(devices: list[Device]) -> None:
    store = open_store(devices)
    objects = {f"k{i}": payload(i, 30_000 + i) for i in range(10)}
    for key, data in objects.items():
        store.put("t", key, extent(data), len(data))
    store.delete("t", ["k3"])
    reopened = open_store(devices)
    assert reopened.exists("t", list(objects)) == [k != "k3" for k in objects]
    for key, data in objects.items():
        if key != "k3":
            assert read(reopened, key, len(data)) == data


def test_corrupt_payload_is_a_miss_and_is_dropped() -> None:
    device = MemoryDevice(SIZE)
    store = open_store([device])
    data = payload(9, 50_000)
    store.put("t", "k", extent(data), len(data))
    location = locations(store, "t", "k")[0]
    device.corrupt(location.offset + 4096 + 1234)
    assert read(store, "k", len(data)) is None
    assert store.exists("t", ["k"]) == [False]
    assert store.statistics().verify_failures == 1


def test_tenants_do_not_see_each_other(devices: list[Device]) -> None:
    store = open_store(devices)
    store.put("a", "k", extent(b"x" * 100), 100)
    assert store.exists("b", ["k"]) == [False]
    assert store.delete("b", ["k"]) == [False]
    assert store.exists("a", ["k"]) == [True]


def test_writing_many_times_the_capacity_stays_bounded(devices: list[Device]) -> None:
    store = open_store(devices)
    capacity = store.statistics().capacity_bytes
    size = 40_000
    count = 5 * capacity // size
    for i in range(count):
        store.put("t", f"k{i}", extent(payload(i % 7, size)), size)
        assert store.statistics().used_bytes <= capacity
    stats = store.statistics()
    assert 0 < stats.objects < count
    newest = f"k{count - 1}"
    assert read(store, newest, size) == payload((count - 1) % 7, size)
    assert read(store, "k0", size) is None  # evicted long ago
    assert open_store(devices).statistics().objects == stats.objects


def test_delete_frees_the_key_and_survives_restart(devices: list[Device]) -> None:
    store = open_store(devices)
    store.put("t", "k", extent(b"y" * 5000), 5000)
    assert store.delete("t", ["k", "never"]) == [True, False]
    assert read(store, "k", 5000) is None
    store.put("t", "k", extent(b"z" * 5000), 5000)  # stored again after the delete
    assert read(open_store(devices), "k", 5000) == b"z" * 5000


def test_same_key_same_length_is_not_written_twice(devices: list[Device]) -> None:
    store = open_store(devices)
    store.put("t", "k", extent(b"a" * 9000), 9000)
    used = store.statistics().used_bytes
    store.put("t", "k", extent(b"a" * 9000), 9000)
    assert store.statistics().used_bytes == used
    assert store.statistics().stores_skipped == 1


class RendezvousDevice(MemoryDevice):
    """Once armed, every I/O waits until the other database has one in flight too: one
    object's fragments must go to both drives at once, or the I/O fails."""

    def __init__(self, size_bytes: int, barrier: threading.Barrier) -> None:
        super().__init__(size_bytes)
        self.barrier = barrier
        self.armed = False

    def _meet(self) -> None:
        if self.armed:
            try:
                self.barrier.wait(timeout=5)
            except threading.BrokenBarrierError:
                raise OSError(errno.ETIMEDOUT, "the other database had no I/O in flight") from None

    def write(self, buffers: list[memoryview], offset: int) -> None:
        self._meet()
        super().write(buffers, offset)

    def read(self, buffers: list[memoryview], offset: int) -> None:
        self._meet()
        super().read(buffers, offset)


def test_one_objects_fragments_use_both_databases_at_once() -> None:
    barrier = threading.Barrier(2)
    devices: list[Device] = [RendezvousDevice(SIZE, barrier), RendezvousDevice(SIZE, barrier)]
    store = open_store(devices)
    data = payload(11, 100_000)  # two fragments: one per database
    store.put("t", "warm-up", extent(data), len(data))  # opens a region on each database
    for device in devices:
        device.armed = True  # type: ignore[attr-defined]
    store.put("t", "k", extent(data), len(data))
    assert read(store, "k", len(data)) == data


def test_recovery_refuses_fragments_that_do_not_cover_their_object() -> None:
    """Two 4 KiB fragments claiming a 1 MiB object would load as a hit with bytes never read."""
    from adp_gateway.card.software.recovery import _assemble
    from adp_gateway.card.software.regions import Location

    at = Location(0, 0, 1, 4096, 8192)
    whole = {0: (at, 8192, 0, 4096, 2), 1: (at, 8192, 4096, 4096, 2)}
    assert _assemble(7, whole) is not None
    assert _assemble(7, {i: (at, 2**20, *f[2:]) for i, f in whole.items()}) is None
    assert _assemble(7, {0: whole[0], 1: (at, 8192, 0, 4096, 2)}) is None  # wrong offset
    assert _assemble(7, {0: whole[0], 1: (at, 8192, 4096, 100, 2)}) is None  # short
    assert _assemble(7, {1: whole[1]}) is None


class SyncLog(MemoryDevice):
    """A memory device that notes each sync in a shared list of events."""

    def __init__(self, size: int, events: list[str]) -> None:
        super().__init__(size)
        self.events = events

    def sync(self) -> None:
        self.events.append("sync")
        super().sync()


def test_a_store_reports_its_writes_landed_before_it_waits_for_its_sync() -> None:
    """``on_written`` runs once the store's writes are on the device and before the group
    commit it waits for, so the scheduler can let the next store write meanwhile."""
    events: list[str] = []
    region_log = RegionLog([SyncLog(4096 + 8 * REGION, events)], REGION, lambda *r: [])
    card = SoftwareCard(
        region_log, 64 * 2**10, sync=True, on_written=lambda: events.append("written")
    )
    card.recover()
    events.clear()
    data = extent(payload(1, 100_000))
    card.put(
        "t",
        [
            Value(0, "k0", data[: 64 * 2**10], 64 * 2**10),
            Value(0, "k1", data[64 * 2**10 :], 100_000 - 64 * 2**10),
        ],
    )
    assert events == ["written", "sync"]


def test_a_value_io_pass_waits_for_every_database_whatever_the_callers_own_raises() -> None:
    """each_database runs the caller's database itself and the others on their pools. When the
    caller's own work raised anything but a StorageError (a bug), it used to return at once,
    while the other databases still wrote from the op's window extent, which the op then gave
    back to its client for reuse. Every database's work must have ended before it raises."""
    log = RegionLog([MemoryDevice(SIZE), MemoryDevice(SIZE)], REGION, lambda *r: [])
    io = ValueIO(log)
    ended: list[float] = []

    def work(database: int) -> int:
        if database == 0:
            raise RuntimeError("a bug in database 0's path")
        time.sleep(0.5)  # database 1's write, still going
        ended.append(time.monotonic())
        return database

    try:
        with pytest.raises(RuntimeError):
            io.each_database(work, [0, 1])
        raised = time.monotonic()
        assert ended and ended[0] <= raised
    finally:
        io.close()


class CountingDevice(MemoryDevice):
    """A device in memory that counts the bytes written to it."""

    written = 0

    def write(self, buffers: list[memoryview], offset: int) -> None:
        super().write(buffers, offset)
        self.written += sum(len(buf) for buf in buffers)


@pytest.mark.parametrize("size", [4096, 60_000, 3 * 2**16 + 100])
def test_a_stores_write_cost_is_what_the_card_writes_for_it(size: int) -> None:
    """The write budget is charged ``write_cost``: within 3 % of what reaches the devices,
    record headers, footers and start records included, where the payload alone is 10 % or
    more short of it."""
    devices = [CountingDevice(SIZE), CountingDevice(SIZE)]
    store = open_store(devices)
    before = sum(d.written for d in devices)
    keys = [f"prompt-{i}/chunk" for i in range(8 * REGION // (size + 8192))]
    cost = sum(store.write_cost("t", key, size) for key in keys)
    for i, key in enumerate(keys):
        store.put("t", key, extent(payload(i, size)), size)
    written = sum(d.written for d in devices) - before
    assert software_card(store).statistics().reclaims == 0  # nothing evicted, nothing lost
    assert abs(cost - written) <= 0.03 * written, (cost, written)
    assert len(keys) * size <= 0.9 * written
