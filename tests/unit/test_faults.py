"""Goal: what storage does wrong never yields wrong bytes, and an acknowledged, synced store
survives it. A model-based run drives random stores, overwrites, deletes and loads through the
store over fault-injecting devices (EIO, ENOSPC, torn writes, stalls) and cuts the power at
random points (unsynced writes stay, vanish or tear); an oracle of acknowledged operations is
checked after every restart."""

from __future__ import annotations

import errno
import os
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from adp_gateway.card.software.devices import filedevice
from adp_gateway.card.software.devices.base import Device
from adp_gateway.card.software.devices.faulty import FaultyDevice
from adp_gateway.card.software.devices.memory import MemoryDevice
from adp_gateway.errors import StorageError
from adp_gateway.objects.store import ObjectStore
from tests.support.storage import REGION, extent, make_devices, open_store, payload

SIZE = 4096 + 64 * REGION  # large enough that nothing is evicted in these runs
SIZES = (1, 4096, 20_000, 70_000, 150_000)  # one to three fragments


def content(key: str, size: int) -> bytes:
    return payload(int(key[1:]) * 1000 + size, size)


class Oracle:
    """What each key may hold after a power cut: its durable length (None when deleted), lengths
    acknowledged since the last sync (which a cut may or may not have kept, or left damaged, so
    a miss too), and lengths an unacknowledged (failed) operation may have left, until a later
    acknowledged operation on the key is durable: a failed store may have written its whole
    version, and a cut that loses the later one's unsynced writes leaves that version the
    newest on the disk.

    ``durable_on_ack``: ``sync: always``, an acknowledged operation is durable at once. Otherwise
    (``periodic``, ``none``) only what was acknowledged before the last sync is."""

    def __init__(self, durable_on_ack: bool) -> None:
        self.durable_on_ack = durable_on_ack
        self.acked: dict[str, int | None] = {}
        self.durable: dict[str, int | None] = {}
        self.since: dict[str, set[int | None]] = {}
        self.maybe: dict[str, set[int | None]] = {}
        self.superseded: set[str] = set()  # last op acknowledged: at a sync, maybe goes

    def allowed(self, key: str) -> set[int | None]:
        recent = self.since.get(key, set())
        return (
            {self.durable.get(key)}
            | recent
            | ({None} if recent else set())
            | self.maybe.get(key, set())
        )

    def attempt(self, key: str, outcomes: set[int | None]) -> None:
        """An operation on ``key`` begins: until it is acknowledged (``settle``), any of
        ``outcomes`` may be what it leaves."""
        self.maybe.setdefault(key, set()).update(outcomes)
        self.superseded.discard(key)

    def settle(self, key: str, found: int | None) -> None:
        self.acked[key] = found
        if self.durable_on_ack:
            self.durable[key] = found
            self.maybe.pop(key, None)
        else:
            self.since.setdefault(key, set()).add(found)
            self.superseded.add(key)

    def synced(self) -> None:
        """Everything acknowledged so far is durable (a sync, or a restart after a cut)."""
        self.durable = dict(self.acked)
        self.since = {}
        for key in self.superseded:
            self.maybe.pop(key, None)
        self.superseded = set()


def run(
    store: ObjectStore,
    oracle: Oracle,
    devices: list[FaultyDevice],
    rng: random.Random,
    tick: float = 0.0,
) -> None:
    """One stretch of random operations with random injected faults; with probability ``tick``
    before each, the clock of ``sync: periodic`` commits everything written so far."""
    for _ in range(40):
        if rng.random() < tick:
            try:
                store.sync_all()
                oracle.synced()
            except StorageError:
                pass  # a failed commit makes nothing durable
        key = f"k{rng.randrange(12)}"
        op = rng.choice(("store", "store", "delete", "load"))
        fault = rng.random()
        device = rng.choice(devices)
        if fault < 0.06:
            device.tear_next_write(rng.randrange(0, 3) * 4096)
        elif fault < 0.10:
            device.fail("write", rng.choice((errno.EIO, errno.ENOSPC)))
        elif fault < 0.13:
            device.fail("read", errno.EIO)
        try:
            if op == "store":
                size = rng.choice(SIZES)
                # A store that fails after burying the old length leaves the key absent.
                oracle.attempt(key, {size, None})
                store.put("t", key, extent(content(key, size)), size)
                oracle.settle(key, size)
            elif op == "delete":
                oracle.attempt(key, {None})
                store.delete("t", [key])
                oracle.settle(key, None)
            else:
                check_key(store, oracle, key, require=False)
        except StorageError:
            pass  # a failed op: the oracle keeps both outcomes possible


def check_key(store: ObjectStore, oracle: Oracle, key: str, require: bool) -> None:
    allowed = oracle.allowed(key)
    version = store.version("t", key)
    found = None if version is None else version.object_bytes
    if version is not None:
        out = extent(bytes(found or 1))
        if store.get("t", key, out, found or 0):
            assert bytes(out[: found or 0]) == content(key, found or 0), f"{key}: wrong bytes"
        else:
            found = None  # a verified miss (damaged record) is allowed, never wrong bytes
    if require:
        assert found in allowed, f"{key}: holds {found}, the oracle allows {allowed}"
        oracle.settle(key, found)  # what the key holds now, whichever allowed state it is


@pytest.mark.parametrize("policy", ["always", "periodic", "none"])
def test_power_cuts_and_device_faults_never_return_wrong_bytes(policy: str) -> None:
    """Under every policy a cut leaves no wrong bytes, and every key holds what it held at the
    last sync or a state acknowledged since (or, if one was, nothing). Under ``always`` that
    is exactly its last acknowledged state; ``periodic`` commits at random points between
    operations; ``none`` never does, so only a restart's recovered state is durable."""
    rng = random.Random({"always": 7, "periodic": 9, "none": 8}[policy])
    memory: list[Device] = [MemoryDevice(SIZE), MemoryDevice(SIZE)]
    oracle = Oracle(durable_on_ack=policy == "always")
    cuts = damaged = recent = 0
    for _ in range(25):
        devices = [FaultyDevice(m) for m in memory]
        store = open_store(list(devices), sync=policy == "always")
        recent += sum(1 for key in oracle.since if oracle.since[key])
        for key in [f"k{i}" for i in range(12)]:
            check_key(store, oracle, key, require=True)
        oracle.synced()  # what recovery found is on the device now
        run(store, oracle, devices, rng, tick=0.15 if policy == "periodic" else 0.0)
        damaged += sum(d.power_loss(rng) for d in devices)
        cuts += 1
    assert cuts == 25 and damaged > 0  # the cuts did destroy unsynced writes
    assert policy == "always" or recent > 0  # and some cuts came after unsynced acknowledgements


def test_a_stalled_device_slows_but_does_not_break_the_store() -> None:
    device = FaultyDevice(MemoryDevice(SIZE))
    store = open_store([device])
    device.delay_s = 0.05
    store.put("t", "k1", extent(content("k1", 20_000)), 20_000)
    out = extent(bytes(20_000))
    assert store.get("t", "k1", out, 20_000) and bytes(out[:20_000]) == content("k1", 20_000)


def test_short_transfers_of_the_kernel_are_finished_by_the_file_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pwritev/preadv may move fewer bytes than asked (a signal, a device limit): the file
    device goes on from where the kernel stopped, so the store sees whole records."""
    real_pwritev, real_preadv = os.pwritev, os.preadv
    calls = {"write": 0, "read": 0}

    def short(real: Callable[..., int], op: str) -> Callable[..., int]:
        def call(fd: int, buffers: list[memoryview], offset: int) -> int:
            calls[op] += 1
            return real(fd, [buffers[0][:4096]], offset)  # one page at most

        return call

    store = open_store(make_devices("file", tmp_path, 2, SIZE // 8))
    monkeypatch.setattr(filedevice.os, "pwritev", short(real_pwritev, "write"))
    monkeypatch.setattr(filedevice.os, "preadv", short(real_preadv, "read"))
    data = payload(3, 150_000)
    store.put("t", "k", extent(data), len(data))
    out = extent(bytes(len(data)))
    assert store.get("t", "k", out, len(data)) and bytes(out[: len(data)]) == data
    assert calls["write"] > 30 and calls["read"] > 30  # the transfers really were cut short


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_io_past_the_end_of_a_device_raises_oserror(kind: str, tmp_path: Path) -> None:
    """What the store and recovery catch from a device is OSError; the in-memory device raised
    ValueError for a read past its end, and grew for a write past it."""
    (device,) = make_devices(kind, tmp_path, 1, 8 * 4096)
    with pytest.raises(OSError):
        device.read([extent(bytes(8192))], 7 * 4096)
    if kind == "memory":  # a file device asserts: the region log never writes past the end
        with pytest.raises(OSError):
            device.write([extent(bytes(8192))], 7 * 4096)
        assert device.size_bytes == 8 * 4096
    device.close()
