"""The software card (``card: software``): objects over the region log, with the in-memory
index, tombstones and delete; recovery is recovery.py's, fragment I/O fragments.py's.

Crash ordering: an object's fragments are written (and synced, under ``sync: always``) before its
manifest is published in the index; a delete removes the manifest first, then appends a
tombstone, and so does an overwrite with another length before it writes the new version. On
restart, ``recover`` rebuilds the index from the records on disk: the newest complete version of
each object wins unless a newer tombstone deletes it. Tombstones outlive the records they shadow
(tombstones.py).

The store tells the region log which records it uses (``retain``/``release``), so eviction
reclaims emptied regions (deleted or overwritten objects) before it evicts anything.

Every read is verified before it is reported loaded: each fragment's header must name the same
tenant, key, version and position, and its payload must match its checksum. Anything else is a
miss, logged, and the object is dropped from the index (invariant 1).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable

from adp_gateway.card.base import Card, CardContext, CardStatistics, Wanted
from adp_gateway.card.software.devices.base import Device
from adp_gateway.card.software.devices.filedevice import FileDevice
from adp_gateway.card.software.fragments import FragmentIO, intact
from adp_gateway.card.software.index import Index, Manifest, ObjectId
from adp_gateway.card.software.pools import Pools
from adp_gateway.card.software.recovery import ProgressLog, rebuild
from adp_gateway.card.software.regionlog import RegionLog
from adp_gateway.card.software.tombstones import Tombstones
from adp_gateway.config import GatewayConfig, region_quotas
from adp_gateway.format import Kind, RecordHeader

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
    ) -> None:
        """``sync``: a store returns once an fdatasync covers it (else once written).
        ``on_written`` is called by a store's thread when its writes have landed, before it
        waits for that sync (the scheduler then lets the next store's writes go). ``prepare``:
        after ``recover``, write never-written regions once in the background."""
        self._log = region_log
        self._fragment_bytes_max = fragment_bytes_max
        self._sync = sync
        self._on_written = on_written or (lambda: None)
        self._prepare = prepare
        self.index = Index()
        self._seq = itertools.count(1)
        self._seq_lock = threading.Lock()
        self._counts: dict[str, int] = defaultdict(int)
        self._tombstones = Tombstones()
        self._tombstones_lock = threading.Lock()
        self._fragments = FragmentIO(region_log)

    @classmethod
    def open(cls, config: GatewayConfig, context: CardContext) -> SoftwareCard:
        """One database per path of the config, each a file (grown to its share of the
        capacity) or a block device."""
        return _open(config, context)

    def on_reclaim(self, database: int, region: int, epoch: int) -> list[RecordHeader]:
        """The region log reclaims a region: forget its objects, return tombstones to carry."""
        dropped = self.index.reclaim(database, region, epoch)
        for manifest in dropped:
            self._log.release(manifest.locations)
        with self._tombstones_lock:
            carried = self._tombstones.carry(database, region, self._log.is_current)
        log.debug(
            "reclaimed database %d region %d: %d objects evicted, %d tombstones carried",
            database,
            region,
            len(dropped),
            len(carried),
        )
        return carried

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
            self._counts["stores_skipped"] += 1
            return
        synced = set()
        if existing is not None and self._drop((tenant, key), existing):
            # Another length: the old version must never come back, so its tombstone is synced
            # with the new version.
            synced.add(existing.locations[0].database)
        if checksums is None:
            extent[object_bytes:] = bytes(len(extent) - object_bytes)  # no stray bytes on disk
        seq = self._next_seq()
        plan = self.fragment_plan(tenant, key, object_bytes)

        locations = self._fragments.write((tenant, key), seq, extent, plan, checksums)
        self._on_written()
        if self._sync:
            self._log.sync(synced | {loc.database for loc in locations})
        manifest = Manifest(seq, object_bytes, self._fragment_bytes_max, tuple(locations))
        self._publish((tenant, key), manifest)
        self._counts["stores"] += 1

    def get(self, tenant: str, key: str, extent: memoryview, object_bytes: int) -> bool:
        """Read the object into ``extent``; True only when every byte was verified."""
        return self.get_many(tenant, [(key, extent, object_bytes)])[0]

    def get_many(self, tenant: str, objects: list[Wanted]) -> list[bool]:
        """Read each object into its extent, all in one pass over the databases (fragments
        that lie back to back on disk share a vectored read); True where every byte was
        verified."""
        self._counts["loads"] += len(objects)
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
        self._counts["load_misses"] += found.count(False)
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
                self._counts["verify_failures"] += 1
                self._drop(object_id, manifest)
                return False
        return True

    def delete(self, tenant: str, keys: Iterable[str]) -> list[bool]:
        results = []
        synced: set[int] = set()
        for key in keys:
            manifest = self.index.get((tenant, key))
            dropped = manifest is not None and self._drop((tenant, key), manifest)
            results.append(dropped)
            if dropped:
                assert manifest is not None
                synced.add(manifest.locations[0].database)
        if self._sync and synced:
            self._log.sync(synced)
        return results

    def _publish(self, object_id: ObjectId, manifest: Manifest) -> None:
        self._log.retain(manifest.locations)
        unused = self.index.put(object_id, manifest)
        if unused is not None:
            self._log.release(unused.locations)

    def _drop(self, object_id: ObjectId, manifest: Manifest) -> bool:
        """Bury this version under a tombstone, then remove it from the index, so that a restart
        agrees with the index; False when the index holds another version by now. Raises
        StorageError, with nothing changed, when the tombstone cannot be written."""
        tombstone = RecordHeader(Kind.TOMBSTONE, self._next_seq(), *object_id, 0)
        at = self._log.append(manifest.locations[0].database, tombstone, None)
        if self.index.remove(object_id, manifest.seq) is None:
            return False
        self._log.release(manifest.locations)
        with self._tombstones_lock:
            self._tombstones.add(object_id, tombstone.seq, at, manifest.locations)
        return True

    def recover(self) -> int:
        """Rebuild the index from disk (recovery.py); returns the number of objects found.
        Then, when the config asks, the preparer starts writing never-written regions."""
        top_seq = rebuild(
            self._log.scan(ProgressLog()), self.index, self._tombstones, self._log.retain
        )
        with self._seq_lock:
            self._seq = itertools.count(top_seq + 1)
        if self._prepare:
            self._log.prepare_in_background()
        return len(self.index)

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
            tombstones=len(self._tombstones),
            **{name: self._counts[name] for name in _COUNTED},
        )

    def _next_seq(self) -> int:
        with self._seq_lock:
            return next(self._seq)


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
    )
    card = SoftwareCard(
        region_log,
        config.fragment_size,
        sync=config.sync == "always",
        on_written=context.on_written,
        prepare=config.prepare_databases,
    )
    holder.append(card)
    return card
