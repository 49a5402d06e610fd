"""Goal: eviction keeps what is used and never brings back what was deleted or replaced.
Recently read objects survive a flood of writes (approximate LRU by region), deleted objects free
their space before anything live is evicted, and a tombstone outlives the records it shadows
whatever order regions are reclaimed in, across restarts."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
import tqdm.std

from adp_gateway.card.base import Wanted
from adp_gateway.card.software.devices.memory import MemoryDevice
from adp_gateway.card.software.regions import Location
from adp_gateway.card.software.tombstones import Tombstones
from adp_gateway.config import GatewayConfig, resolve_capacity
from adp_gateway.objects.store import ObjectStore
from adp_wire.ring.layout import PAGE_BYTES
from tests.support.storage import (
    FRAGMENT,
    REGION,
    extent,
    locations,
    open_store,
    payload,
    software_card,
)

SIZE = 4096 + 8 * REGION  # one database of eight regions


def read(store: ObjectStore, key: str, size: int) -> bytes | None:
    out = extent(bytes(size))
    return bytes(out[:size]) if store.get("t", key, out, size) else None


def region_of(store: ObjectStore, key: str) -> int:
    return locations(store, "t", key)[0].region


def flood(store: ObjectStore, count: int, hot: dict[str, bytes], tag: str = "cold") -> None:
    """Write ``count`` new 40 KB objects, reading every ``hot`` object after every fourth."""
    for i in range(count):
        store.put("t", f"{tag}{i}", extent(payload(i % 5, 40_000)), 40_000)
        if i % 4 == 0:
            for key, data in hot.items():
                assert read(store, key, len(data)) == data, f"{key} evicted at write {i}"


def test_recently_read_objects_survive_a_flood_of_writes() -> None:
    store = open_store([MemoryDevice(SIZE)])
    hot = {f"hot{i}": payload(100 + i, 20_000) for i in range(3)}
    for key, data in hot.items():
        store.put("t", key, extent(data), len(data))
    count = 5 * store.statistics().capacity_bytes // 40_000
    flood(store, count, hot)
    assert store.statistics().reclaims >= 20
    assert read(store, f"cold{count // 2}", 40_000) is None  # cold regions went


def test_deleted_objects_free_space_before_anything_live_is_evicted() -> None:
    store = open_store([MemoryDevice(SIZE)])
    count = (store.statistics().capacity_bytes - 2 * REGION) // 45_000
    for i in range(count):
        store.put("t", f"a{i}", extent(payload(i, 40_000)), 40_000)
    store.delete("t", [f"a{i}" for i in range(1, count)])  # keep a0, in the oldest region
    for i in range(count):
        store.put("t", f"b{i}", extent(payload(i, 40_000)), 40_000)
    assert store.statistics().reclaims > 0  # the space was reused...
    assert read(store, "a0", 40_000) == payload(0, 40_000)  # ...without evicting a live object
    assert store.exists("t", [f"b{i}" for i in range(count)]) == [True] * count


def fill_region(store: ObjectStore, key: str) -> None:
    """Write filler until the open region is no longer the one holding ``key``."""
    region = region_of(store, key)
    i = 0
    while region_of(store, f"fill-{key}-{i - 1}" if i else key) == region:
        store.put("t", f"fill-{key}-{i}", extent(payload(i, 40_000)), 40_000)
        i += 1


def test_a_deleted_object_never_returns_when_its_tombstone_is_evicted_first() -> None:
    device = MemoryDevice(SIZE)
    store = open_store([device])
    hot = {"hot": payload(1, 20_000)}
    store.put("t", "gone", extent(payload(2, 20_000)), 20_000)
    store.put("t", "hot", extent(hot["hot"]), 20_000)
    fill_region(store, "gone")
    assert store.delete("t", ["gone"]) == [True]  # its tombstone lands in a newer region
    flood(store, 3 * store.statistics().capacity_bytes // 40_000, hot)  # the old region stays hot
    reopened = open_store([device])
    assert reopened.exists("t", ["gone", "hot"]) == [False, True]
    assert reopened.statistics().tombstones == 1  # still shadowing the data in the hot region


def test_an_overwritten_object_never_returns_in_its_old_length() -> None:
    device = MemoryDevice(SIZE)
    store = open_store([device])
    hot = {"hot": payload(1, 20_000)}
    store.put("t", "k", extent(payload(2, 20_000)), 20_000)
    store.put("t", "hot", extent(hot["hot"]), 20_000)
    fill_region(store, "k")
    store.put("t", "k", extent(payload(3, 30_000)), 30_000)  # another length: a new version
    assert read(store, "k", 30_000) == payload(3, 30_000)
    flood(store, 3 * store.statistics().capacity_bytes // 40_000, hot)
    version = open_store([device]).version("t", "k")
    assert version is None or version.object_bytes == 30_000


def test_used_space_and_objects_are_the_same_after_a_restart() -> None:
    device = MemoryDevice(SIZE)
    store = open_store([device])
    flood(store, 3 * store.statistics().capacity_bytes // 40_000, {})
    before = store.statistics()
    after = open_store([device]).statistics()
    assert after.objects == before.objects > 0
    assert after.capacity_bytes == before.capacity_bytes
    assert before.used_bytes - REGION <= after.used_bytes <= after.capacity_bytes


def test_an_automatic_capacity_is_taken_from_existing_databases(tmp_path: Path) -> None:
    config = GatewayConfig(data_dirs=[str(tmp_path)], databases_per_dir=2, region_size=2**20)
    for path in config.database_paths:
        with open(path, "wb") as f:
            f.truncate(24 * 2**20)  # as a first start would have made them
    assert resolve_capacity(config).capacity == 48 * 2**20


def test_a_recovery_longer_than_a_few_seconds_logs_its_progress(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    device = MemoryDevice(SIZE)
    flood(open_store([device]), 40, {})
    clock = iter(range(0, 100_000, 5))  # every reading of tqdm's clock is 5 seconds later
    monkeypatch.setattr(tqdm.std, "time", lambda: float(next(clock)))
    caplog.set_level(logging.INFO, logger="adp_gateway.card.software.recovery")
    open_store([device])
    lines = [r.getMessage() for r in caplog.records if "recovering:" in r.getMessage()]
    assert len(lines) >= 5 and lines[-1].startswith("recovering: 8 of 8 regions read (100 %)")


class PausingDevice(MemoryDevice):
    """Its next read, once armed, waits until released: a load caught mid-I/O."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.armed = False
        self.reading = threading.Event()
        self.release = threading.Event()

    def read(self, buffers: list[memoryview], offset: int) -> None:
        if self.armed:
            self.armed = False
            self.reading.set()
            self.release.wait(30)
        super().read(buffers, offset)


def test_a_region_being_read_is_not_reclaimed_under_the_read() -> None:
    device = PausingDevice(SIZE)
    store = open_store([device])
    data = payload(1, 40_000)
    store.put("t", "victim", extent(data), len(data))
    out = extent(bytes(len(data)))
    device.armed = True
    loaded: list[bool] = []
    reader = threading.Thread(target=lambda: loaded.append(store.get("t", "victim", out, 40_000)))
    reader.start()
    assert device.reading.wait(10)
    flood(store, 2 * store.statistics().capacity_bytes // 40_000, {})  # every other region goes
    device.release.set()
    reader.join(10)
    assert loaded == [True] and bytes(out[: len(data)]) == data


def test_a_load_that_races_its_objects_eviction_is_a_plain_miss(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """On the card: a value looked up just before its region was reclaimed, then read."""
    store = open_store([MemoryDevice(SIZE)])
    store.put("t", "victim", extent(payload(1, 40_000)), 40_000)
    version = store.version("t", "victim")
    assert version is not None
    name, card = version.names("victim")[0], software_card(store)
    manifest = card.index.get(("t", name))
    assert manifest is not None
    flood(store, 2 * store.statistics().capacity_bytes // 40_000, {})
    assert store.exists("t", ["victim"]) == [False]
    card.index.put(("t", name), manifest)  # as if looked up just before the reclaim
    assert card.get("t", [Wanted(name, extent(bytes(40_000)), 40_000)]) == [False]
    assert store.statistics().verify_failures == 0
    assert "not what the index says" not in caplog.text


ONE_REGION = 3 * FRAGMENT  # three records fill a region: no fourth fits
GONE_REGION = PAGE_BYTES  # the first region's start, after the superblock


def image_of(device: MemoryDevice) -> MemoryDevice:
    """A copy of ``device``'s bytes, as a restart would find them now."""
    copy = MemoryDevice(device.size_bytes)
    device.read([memoryview(copy._data)], 0)
    return copy


def bury_in_a_full_log(store: ObjectStore) -> None:
    """Store ``gone`` alone in the first region, delete it (its tombstone goes beside ``f0`` in
    the second), and fill the rest: the next region taken is gone's, reclaimed."""
    store.put("t", "gone", extent(payload(1, ONE_REGION)), ONE_REGION)
    for i in range(21):  # one region after another, all of them taken
        store.put("t", f"f{i}", extent(payload(i, FRAGMENT)), FRAGMENT)
        if i == 0:
            assert store.delete("t", ["gone"]) == [True]
    assert region_of(store, "f0") == 1 and region_of(store, "f20") == 7


class HoldingDevice(MemoryDevice):
    """Once armed, the next write at ``held_offset`` waits until released: a write that has
    not landed when the process is killed."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.held_offset = -1
        self.writing = threading.Event()
        self.release = threading.Event()

    def write(self, buffers: list[memoryview], offset: int) -> None:
        if offset == self.held_offset:
            self.held_offset = -1
            self.writing.set()
            self.release.wait(30)
        super().write(buffers, offset)


def test_a_tombstone_outlives_its_records_until_their_regions_new_filling_has_landed() -> None:
    """The region of a deleted object's records is reclaimed, but the first write of its next
    filling has not landed when the region of the object's tombstone is reclaimed too: the
    tombstone must be carried, since a kill then leaves the old records on disk."""
    device = HoldingDevice(SIZE)
    store = open_store([device], sync=False)
    bury_in_a_full_log(store)
    device.held_offset = GONE_REGION
    trigger = threading.Thread(
        target=store.put, args=("t", "new", extent(payload(2, ONE_REGION)), ONE_REGION)
    )
    trigger.start()  # reclaims gone's region (nothing in it is used); its first write is held
    assert device.writing.wait(10)
    store.put("t", "next", extent(payload(3, FRAGMENT)), FRAGMENT)  # reclaims the tombstone's
    assert region_of(store, "next") == 1
    killed_now = image_of(device)
    device.release.set()
    trigger.join(10)
    assert open_store([killed_now]).exists("t", ["gone", "f20", "next"]) == [False, True, True]


class PowerCutDevice(MemoryDevice):
    """Remembers what each write since the last sync overwrote: ``image(lost)`` is the device
    after a power cut that lost the unsynced writes at the offsets ``lost`` (and kept the
    others, as a disk may persist unsynced writes in any order)."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.unsynced: list[tuple[int, bytes]] = []

    def write(self, buffers: list[memoryview], offset: int) -> None:
        before = bytearray(sum(len(b) for b in buffers))
        super().read([memoryview(before)], offset)
        self.unsynced.append((offset, bytes(before)))
        super().write(buffers, offset)

    def sync(self) -> None:
        self.unsynced.clear()
        super().sync()

    def image(self, lost: set[int]) -> MemoryDevice:
        copy = image_of(self)
        for offset, before in reversed(self.unsynced):
            if offset in lost:
                copy.write([memoryview(before)], offset)
        return copy


def test_a_tombstone_outlives_its_records_until_their_regions_new_filling_is_synced() -> None:
    """As above, but the first write of the new filling landed and was not synced yet when the
    tombstone's region was reclaimed: a power cut may lose that write and keep the later ones,
    so the tombstone must still be carried (under ``sync: periodic`` or ``always``)."""
    device = PowerCutDevice(SIZE)
    store = open_store([device], sync=False)  # synced only when told, as between two ticks
    bury_in_a_full_log(store)
    store.sync_all()
    store.put("t", "new", extent(payload(2, ONE_REGION)), ONE_REGION)  # reclaims gone's region
    store.put("t", "next", extent(payload(3, FRAGMENT)), FRAGMENT)  # and the tombstone's
    assert region_of(store, "new") == 0 and region_of(store, "next") == 1
    after_cut = device.image(lost={GONE_REGION})  # the new filling's first write there
    assert open_store([after_cut]).exists("t", ["gone", "f20", "next"]) == [False, True, True]


def test_the_newest_tombstone_takes_over_what_an_older_one_recorded_after_it_shadows() -> None:
    """Two drops of one key race: the older tombstone is recorded last. The records it shadows
    must still keep the newer one carried."""
    tombstones = Tombstones()
    at = {region: Location(0, region, 1, 4096 + region * REGION, 4096) for region in range(3)}
    tombstones.add(("t", "k"), 9, at[0], [])
    tombstones.add(("t", "k"), 5, at[1], [at[2]])  # recorded after the newer one
    carried = tombstones.carry(0, 0, lambda location: True)
    assert [(h.seq, h.key) for h in carried] == [(9, "k")]
