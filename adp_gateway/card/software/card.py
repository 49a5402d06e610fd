"""The software card (``card: software``): objects over the region log. What it holds (manifests,
tombstones, versions) is catalog.py's, how fragments are written and read fragments.py's, and
recovery recovery.py's.

Crash ordering: an object's fragments are written (and synced, under ``sync: always``) before its
manifest is published in the catalog; a delete buries the version under a tombstone before it
leaves the index, and so does an overwrite with another length before it writes the new version.
On restart the catalog is rebuilt from the records on disk: the newest complete version of each
object wins unless a newer tombstone deletes it.

Every read is verified before it is reported loaded: each fragment's header must name the same
tenant, key, version and position, and its payload must match its checksum. Anything else is a
miss, logged, and the object is dropped from the index (invariant 1).
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable

from adp_gateway.card.base import Card, CardContext, CardStatistics, Holdings, Wanted
from adp_gateway.card.holdings import NO_HOLDINGS
from adp_gateway.card.software.catalog import Catalog
from adp_gateway.card.software.devices.base import Device
from adp_gateway.card.software.devices.filedevice import FileDevice
from adp_gateway.card.software.fragments import FragmentIO, intact
from adp_gateway.card.software.index import Index, Manifest, ObjectId
from adp_gateway.card.software.pools import Pools
from adp_gateway.card.software.regionlog import RegionLog
from adp_gateway.config import GatewayConfig, region_quotas
from adp_gateway.format import RecordHeader

log = logging.getLogger(__name__)
_COUNTED = ("loads", "load_misses", "stores", "stores_skipped", "verify_failures")


class SoftwareCard(Card):
    persistent = True

    def __init__(
        self,
        region_log: RegionLog,
        fragment_bytes_max: int,
        sync: bool,
        on_written: Callable[[], None] | None = None,
        prepare: bool = False,
        holdings: Holdings = NO_HOLDINGS,
    ) -> None:
        """``sync``: a store returns once an fdatasync covers it (else once written).
        ``on_written`` is called by a store's thread when its writes have landed, before it
        waits for that sync (the scheduler then lets the next store's writes go). ``prepare``:
        after ``recover``, write never-written regions once in the background. ``holdings``
        hears of every key the index gains or loses (card/holdings.py)."""
        self._log = region_log
        self._fragment_bytes_max = fragment_bytes_max
        self._sync = sync
        self._on_written = on_written or (lambda: None)
        self._prepare = prepare
        self._catalog = Catalog(region_log, holdings)
        self._counts: dict[str, int] = defaultdict(int)
        self._counts_lock = threading.Lock()  # the I/O threads count at once
        self._fragments = FragmentIO(region_log)

    @classmethod
    def open(cls, config: GatewayConfig, context: CardContext) -> SoftwareCard:
        """One database per path of the config, each a file (grown to its share of the
        capacity) or a block device."""
        return _open(config, context)

    @property
    def index(self) -> Index:
        """The manifests of the objects held (tests and ``adp-gateway check`` inspect it)."""
        return self._catalog.index

    def on_reclaim(self, database: int, region: int, epoch: int) -> list[RecordHeader]:
        """The region log reclaims a region: forget its objects, return tombstones to carry."""
        return self._catalog.on_reclaim(database, region, epoch)

    @property
    def databases(self) -> int:
        return self._log.databases

    @property
    def fragment_bytes(self) -> int:
        return self._fragment_bytes_max

    def databases_holding(self, tenant: str, keys: list[str]) -> frozenset[int]:
        """The databases a load or delete of these objects touches (for the scheduler)."""
        found = (self.index.get((tenant, key)) for key in keys)
        return frozenset(loc.database for m in found if m is not None for loc in m.locations)

    def pool_bytes(self, tenant: str) -> tuple[int, int]:
        """The bytes of regions ``tenant``'s pool holds, and the most it may hold."""
        return self._log.pool_bytes(tenant)

    def exists(self, tenant: str, keys: list[str]) -> list[bool]:
        return self.index.contains(tenant, keys)

    def put(
        self,
        tenant: str,
        key: str,
        extent: memoryview,
        object_bytes: int,
        checksums: list[int] | None = None,
    ) -> None:
        """Persist ``extent[:object_bytes]``; ``extent`` is page aligned and padded to 4 KiB.

        ``checksums`` (one per fragment, from ``fragment_count``) are the payload checksums the
        client computed for a zero-copy store: then ``extent`` is the client's L1, which the
        gateway only hands to the kernel (never reads or pads). A store whose bytes changed
        under the write is caught by those checksums at its first load.

        An object already stored with the same length is not written again: keys name content
        (LMCache's chunk hashes), so the bytes are the same.
        """
        existing = self.index.get((tenant, key))
        if existing is not None and existing.object_bytes == object_bytes:
            self._count("stores_skipped", 1)
            return
        synced = set()
        if existing is not None and self._catalog.drop((tenant, key), existing):
            # Another length: the old version must never come back, so its tombstone is synced
            # with the new version.
            synced.add(existing.locations[0].database)
        if checksums is None:
            extent[object_bytes:] = bytes(len(extent) - object_bytes)  # no stray bytes on disk
        seq = self._catalog.next_seq()
        plan = self.fragment_plan(tenant, key, object_bytes)

        locations = self._fragments.write((tenant, key), seq, extent, plan, checksums)
        self._on_written()
        if self._sync:
            self._log.sync(synced | {loc.database for loc in locations})
        manifest = Manifest(seq, object_bytes, self._fragment_bytes_max, tuple(locations))
        self._catalog.publish((tenant, key), manifest)
        self._count("stores", 1)

    def get(self, tenant: str, key: str, extent: memoryview, object_bytes: int) -> bool:
        """Read the object into ``extent``; True only when every byte was verified."""
        return self.get_many(tenant, [(key, extent, object_bytes)])[0]

    def get_many(self, tenant: str, objects: list[Wanted]) -> list[bool]:
        """Read each object into its extent, all in one pass over the databases (fragments
        that lie back to back on disk share a vectored read); True where every byte was
        verified."""
        self._count("loads", len(objects))
        found = [False] * len(objects)
        wanted: list[tuple[int, Manifest]] = []
        for number, (key, _, object_bytes) in enumerate(objects):
            manifest = self.index.get((tenant, key))
            if manifest is not None and manifest.object_bytes == object_bytes:
                wanted.append((number, manifest))
        reads = self._fragments.read_isolated([(m, objects[n][1]) for n, m in wanted], tenant)
        for (number, manifest), read in zip(wanted, reads, strict=True):
            key, extent, _ = objects[number]
            if read is not None:
                found[number] = self._verified((tenant, key), manifest, read, extent)
        self._count("load_misses", found.count(False))
        return found

    def _verified(
        self,
        object_id: ObjectId,
        manifest: Manifest,
        headers: list[RecordHeader | None],
        extent: memoryview,
    ) -> bool:
        """Whether the fragments read into ``extent`` are this version's, intact; a corrupt
        one drops the object (invariant 1), an evicted one is a plain miss."""
        if None in headers and not all(map(self._log.is_current, manifest.locations)):
            return False  # evicted since it was looked up
        for index, header in enumerate(headers):
            if not intact(object_id, manifest, index, header, extent):
                self._count("verify_failures", 1)
                self._catalog.drop(object_id, manifest)
                return False
        return True

    def delete(self, tenant: str, keys: Iterable[str]) -> list[bool]:
        results = []
        synced: set[int] = set()
        for key in keys:
            manifest = self.index.get((tenant, key))
            dropped = manifest is not None and self._catalog.drop((tenant, key), manifest)
            results.append(dropped)
            if dropped:
                assert manifest is not None
                synced.add(manifest.locations[0].database)
        if self._sync and synced:
            self._log.sync(synced)
        return results

    def recover(self) -> int:
        """Rebuild the catalog from disk; returns the number of objects found. Then, when the
        config asks, the preparer starts writing never-written regions."""
        found = self._catalog.recover()
        if self._prepare:
            self._log.prepare_in_background()
        return found

    def sync_all(self) -> None:
        """Make every write so far durable on every database."""
        self._log.sync(set(range(self._log.databases)))

    def close(self) -> None:
        self._fragments.close()
        self._log.close()

    def statistics(self) -> CardStatistics:
        return CardStatistics(
            objects=len(self.index),
            used_bytes=self._log.used_bytes,
            capacity_bytes=self._log.capacity_bytes,
            reclaims=self._log.reclaims,
            tombstones=self._catalog.tombstones,
            **self._counted(),
        )

    def _count(self, name: str, increment: int) -> None:
        with self._counts_lock:
            self._counts[name] += increment

    def _counted(self) -> dict[str, int]:
        with self._counts_lock:
            return {name: self._counts[name] for name in _COUNTED}


def _open(config: GatewayConfig, context: CardContext) -> SoftwareCard:
    assert config.capacity is not None
    paths = config.database_paths
    per_database = config.capacity // len(paths)
    devices: list[Device] = [
        context.wrap_device(
            database, path, FileDevice(path, per_database, grow=path not in config.devices)
        )
        for database, path in enumerate(paths)
    ]
    holder: list[SoftwareCard] = []
    region_log = RegionLog(
        devices,
        config.region_size,
        lambda *region: holder[0].on_reclaim(*region),
        Pools(region_quotas(config)),
        durable_fillings=config.sync != "none",
    )
    card = SoftwareCard(
        region_log,
        config.fragment_size,
        sync=config.sync == "always",
        on_written=context.on_written,
        prepare=config.prepare_databases,
        holdings=context.holdings,
    )
    holder.append(card)
    return card
