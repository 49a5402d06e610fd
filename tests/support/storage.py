"""Build a store over real or in-memory devices, and page-aligned object buffers."""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np

from adp_gateway.card.software.card import SoftwareCard
from adp_gateway.card.software.devices.base import Device
from adp_gateway.card.software.devices.filedevice import FileDevice
from adp_gateway.card.software.devices.memory import MemoryDevice
from adp_gateway.card.software.regionlog import Pools, RegionLog
from adp_wire.ring.layout import align_up

REGION = 256 * 2**10
FRAGMENT = 64 * 2**10


def make_devices(kind: str, tmp_path: Path, count: int, size: int) -> list[Device]:
    if kind == "memory":
        return [MemoryDevice(size) for _ in range(count)]
    return [FileDevice(str(tmp_path / f"db{i}.adp"), size) for i in range(count)]


def open_store(
    devices: list[Device], sync: bool = True, pools: Pools | None = None
) -> SoftwareCard:
    holder: list[SoftwareCard] = []
    region_log = RegionLog(devices, REGION, lambda *r: holder[0].on_reclaim(*r), pools)
    store = SoftwareCard(region_log, FRAGMENT, sync=sync)
    holder.append(store)
    store.recover()
    return store


def extent(data: bytes) -> memoryview:
    """A page-aligned buffer holding ``data``, padded to 4 KiB (as the transfer window is)."""
    buf = memoryview(mmap.mmap(-1, align_up(max(len(data), 1))))
    buf[: len(data)] = data
    return buf


def payload(seed: int, size: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()
