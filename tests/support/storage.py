"""Build a store over real or in-memory devices, and page-aligned object buffers."""

from __future__ import annotations

import mmap
from pathlib import Path
from typing import Any

import numpy as np

from adp_gateway.card.holdings import NO_HOLDINGS, Holdings
from adp_gateway.card.software.card import SoftwareCard
from adp_gateway.card.software.devices.base import Device
from adp_gateway.card.software.devices.filedevice import FileDevice
from adp_gateway.card.software.devices.memory import MemoryDevice
from adp_gateway.card.software.regionlog import Pools, RegionLog
from adp_gateway.card.software.regions import Location
from adp_gateway.card.software.victims import Ranking
from adp_gateway.config import GatewayConfig
from adp_gateway.objects.catalog import ObjectCatalog
from adp_gateway.objects.store import ObjectStore
from adp_wire.ring.layout import align_up

REGION = 256 * 2**10
FRAGMENT = 64 * 2**10


def make_devices(kind: str, tmp_path: Path, count: int, size: int) -> list[Device]:
    if kind == "memory":
        return [MemoryDevice(size) for _ in range(count)]
    return [FileDevice(str(tmp_path / f"db{i}.adp"), size) for i in range(count)]


def open_card(
    devices: list[Device],
    sync: bool = True,
    pools: Pools | None = None,
    holdings: Holdings = NO_HOLDINGS,
    ranking: Ranking = Ranking.SCAN_RESISTANT,
) -> SoftwareCard:
    """A software card over ``devices``, not yet recovered, evicting as ``ranking`` says."""
    holder: list[SoftwareCard] = []
    region_log = RegionLog(
        devices, REGION, lambda *r: holder[0].on_reclaim(*r), pools, ranking=ranking
    )
    card = SoftwareCard(region_log, FRAGMENT, sync=sync, holdings=holdings)
    holder.append(card)
    return card


def open_store(devices: list[Device], sync: bool = True, pools: Pools | None = None) -> ObjectStore:
    """An object store over a software card over ``devices``, recovered."""
    catalog = ObjectCatalog(NO_HOLDINGS)
    store = ObjectStore(open_card(devices, sync, pools, catalog), catalog)
    store.recover()
    return store


def software_card(store: ObjectStore) -> SoftwareCard:
    assert isinstance(store.card, SoftwareCard)
    return store.card


def extent(data: bytes) -> memoryview:
    """A page-aligned buffer holding ``data``, padded to 4 KiB (as the transfer window is)."""
    buf = memoryview(mmap.mmap(-1, align_up(max(len(data), 1))))
    buf[: len(data)] = data
    return buf


def payload(seed: int, size: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def locations(store: ObjectStore, tenant: str, key: str) -> list[Location]:
    """Where each fragment of the object held lies on the software card under ``store``."""
    version = store.version(tenant, key)
    assert version is not None, f"{tenant}/{key} is not held"
    index = software_card(store).index
    found = [index.get((tenant, name)) for name in version.names(key)]
    return [manifest.locations[0] for manifest in found if manifest is not None]


CARD_DATABASES = 2
CARD_CAPACITY = CARD_DATABASES * (4096 + 8 * REGION)  # 8 regions per database


def card_config(card: str, directory: Path, **settings: Any) -> GatewayConfig:
    """The config the contract suites open each card with, as the gateway would: two databases
    of eight regions in ``directory``, fragments (values) of at most FRAGMENT, ``sync: always``;
    ``settings`` adds to it (tenants, say)."""
    return GatewayConfig(
        card=card,
        data_dirs=[str(directory)],
        databases_per_dir=CARD_DATABASES,
        capacity=CARD_CAPACITY,
        region_size=REGION,
        fragment_size=FRAGMENT,
        prepare_databases=False,
        sync="always",
        **settings,
    )
