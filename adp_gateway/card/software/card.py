"""The software card (``card: software``): named values over the region log, each value one
record. What it holds (manifests, tombstones, sequence numbers) is catalog.py's, how records are
written and read values.py's, and recovery recovery.py's.

Crash ordering: a value's record is written (and synced, under ``sync: always``) before its
manifest is published in the catalog; a delete buries the value under a tombstone before it
leaves the index, and so does a put over a held name before it writes the new record. On restart
the catalog is rebuilt from the records on disk: the newest record of each name wins unless a
newer tombstone deletes it.

Every read is verified before it is reported: the record's header must name the same namespace,
name and sequence number, and its payload must match its checksum. Anything else is a miss,
logged, and the value is dropped from the index (invariant 1).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterable

from adp_gateway.card.base import (
    Card,
    CardConfig,
    CardContext,
    CardReport,
    CardStatistics,
    Holdings,
    Value,
    ValueObserver,
    Wanted,
)
from adp_gateway.card.holdings import NO_HOLDINGS
from adp_gateway.card.software import check as checking
from adp_gateway.card.software.catalog import ValueCatalog
from adp_gateway.card.software.devices.base import Device
from adp_gateway.card.software.devices.filedevice import FileDevice
from adp_gateway.card.software.devices.health import DeviceHealth
from adp_gateway.card.software.format import RecordHeader
from adp_gateway.card.software.formatting import format_databases
from adp_gateway.card.software.index import Index, Manifest, ValueId
from adp_gateway.card.software.pools import Pools
from adp_gateway.card.software.regionlog import RegionLog
from adp_gateway.card.software.sealing import write_cost
from adp_gateway.card.software.settings import SoftwareCardConfig, software_config
from adp_gateway.card.software.values import ValueIO, intact
from adp_gateway.card.software.victims import Ranking
from adp_gateway.errors import StorageError

log = logging.getLogger(__name__)


def wrap_device(device: Device) -> Device:
    """What a software card does with each device it opens before it uses it: the gateway
    leaves it as it is; tests put a function of theirs here that wraps it in a FaultyDevice
    (tests/support/faulty_gateway.py)."""
    return device


class SoftwareCard(Card):
    persistent = True

    def __init__(
        self,
        region_log: RegionLog,
        value_bytes: int,
        sync: bool,
        on_written: Callable[[], None] | None = None,
        prepare: bool = False,
        holdings: Holdings = NO_HOLDINGS,
        health: list[DeviceHealth] | None = None,
    ) -> None:
        """``sync``: a store returns once an fdatasync covers it (else once written).
        ``on_written`` is called by a store's thread when its writes have landed, before it
        waits for that sync (the scheduler then lets the next store's writes go). ``prepare``:
        after ``recover``, write never-written regions once in the background. ``holdings``
        hears of every name the index gains or loses (card/holdings.py). ``health``: the
        region log's devices as they count their failures, for ``database_states``."""
        self._log = region_log
        self._health = health or []
        self._value_bytes = value_bytes
        self._sync = sync
        self._on_written = on_written or (lambda: None)
        self._prepare = prepare
        self._catalog = ValueCatalog(region_log, holdings)
        self._verify_failures = 0
        self._counts_lock = threading.Lock()  # the I/O threads count at once
        self._io = ValueIO(region_log)

    @classmethod
    def open(cls, config: CardConfig, context: CardContext) -> SoftwareCard:
        """One database per path of the config, each a file (grown to its share of the
        capacity) or a block device."""
        return _open(software_config(config), context)

    @classmethod
    def check(cls, config: CardConfig, fix: bool, values: ValueObserver) -> CardReport:
        """Walk every record of every database (``adp-gateway check``): verify each payload,
        compare each footer, account for every byte; ``fix`` rewrites what can be rewritten."""
        settings = software_config(config)
        progress = checking.ProgressLine()
        paths, region_bytes = settings.database_paths, settings.region_size
        report = checking.check(paths, fix, progress, region_bytes, values)
        return CardReport(report.damage, report.summary(), bool(report.damage) and not fix)

    @classmethod
    def format(cls, config: CardConfig, force: bool) -> CardReport:
        """Format the databases that hold nothing (all of them with ``force``)."""
        done = format_databases(software_config(config), force)
        what = f"{len(done.lines)} database(s), {done.refused} refused"
        return CardReport(done.lines, what, bool(done.refused))

    def database_states(self) -> list[dict[str, object]]:
        return [device.state() for device in self._health]

    @property
    def index(self) -> Index:
        """The manifests of the values held (tests and ``adp-gateway check`` inspect it)."""
        return self._catalog.index

    def on_reclaim(self, database: int, region: int, epoch: int) -> list[RecordHeader]:
        """The region log reclaims a region: forget its values, return tombstones to carry."""
        return self._catalog.on_reclaim(database, region, epoch)

    @property
    def databases(self) -> int:
        return self._log.databases

    @property
    def value_bytes(self) -> int:
        return self._value_bytes

    def databases_holding(self, namespace: str, names: list[str]) -> frozenset[int]:
        found = (self.index.get((namespace, name)) for name in names)
        return frozenset(loc.database for m in found if m is not None for loc in m.locations)

    def pool_bytes(self, namespace: str) -> tuple[int, int]:
        """The bytes of regions ``namespace``'s pool holds, and the most it may hold."""
        return self._log.pool_bytes(namespace)

    def exists(self, namespace: str, names: list[str]) -> list[bool]:
        return self.index.contains(namespace, names)

    def put(self, namespace: str, values: list[Value]) -> None:
        """Each value as one record; a held name is buried under a tombstone first (synced with
        the new records), so its old value never comes back."""
        synced = set()
        for value in values:
            existing = self.index.get((namespace, value.name))
            if existing is not None and self._catalog.drop((namespace, value.name), existing):
                synced.add(existing.locations[0].database)
        seq = self._catalog.next_seq()
        locations = self._io.write(namespace, seq, values)
        self._on_written()
        if self._sync:
            self._log.sync(synced | {loc.database for loc in locations})
        for value, location in zip(values, locations, strict=True):
            manifest = Manifest(seq, value.length, max(value.length, 1), (location,))
            self._catalog.publish((namespace, value.name), manifest)

    def get(self, namespace: str, wanted: list[Wanted]) -> list[bool]:
        """Read each value into its ``into``, all in one pass over the databases (records that
        lie back to back on disk share a vectored read); True where every byte was verified."""
        found = [False] * len(wanted)
        reads: list[tuple[int, Manifest]] = []
        for number, (name, _, length) in enumerate(wanted):
            manifest = self.index.get((namespace, name))
            if manifest is not None and manifest.object_bytes == length:
                reads.append((number, manifest))
        got = self._io.read_isolated([(m, wanted[n].into) for n, m in reads], namespace)
        for (number, manifest), read in zip(reads, got, strict=True):
            if read is not None:
                value_id = (namespace, wanted[number].name)
                found[number] = self._verified(value_id, manifest, read, wanted[number].into)
        return found

    def _verified(
        self,
        value_id: ValueId,
        manifest: Manifest,
        headers: list[RecordHeader | None],
        into: memoryview,
    ) -> bool:
        """Whether the records read into ``into`` are this value's, intact; a corrupt one drops
        the value (invariant 1), an evicted one is a plain miss."""
        if None in headers and not all(map(self._log.is_current, manifest.locations)):
            return False  # evicted since it was looked up
        for index, header in enumerate(headers):
            if not intact(value_id, manifest, index, header, into):
                with self._counts_lock:
                    self._verify_failures += 1
                try:
                    self._catalog.drop(value_id, manifest)
                except StorageError as exc:  # kept in the index: the next read misses again
                    log.warning("%s/%s is corrupt and could not be dropped: %s", *value_id, exc)
                return False
        return True

    def delete(self, namespace: str, names: Iterable[str]) -> list[bool]:
        results = []
        synced: set[int] = set()
        for name in names:
            manifest = self.index.get((namespace, name))
            dropped = manifest is not None and self._catalog.drop((namespace, name), manifest)
            results.append(dropped)
            if dropped:
                assert manifest is not None
                synced.add(manifest.locations[0].database)
        if self._sync and synced:
            self._log.sync(synced)
        return results

    def recover(self) -> int:
        """Rebuild the catalog from disk; returns the number of values found. Then, when the
        config asks, the preparer starts writing never-written regions."""
        found = self._catalog.recover()
        if self._prepare:
            self._log.prepare_in_background()
        return found

    def write_cost(self, namespace: str, name: str, value_bytes: int) -> int:
        names_bytes = len(namespace.encode()) + len(name.encode())
        return write_cost(value_bytes, names_bytes, self._log.region_bytes)

    def eviction_age_s(self) -> float | None:
        return self._log.eviction_age_s()

    def sync_all(self) -> None:
        """Make every write so far durable on every database."""
        self._log.sync(set(range(self._log.databases)))

    def syncs(self) -> list[Callable[[], None]]:
        """One per database: a database whose fdatasync does not return holds only its own."""
        return [functools.partial(self._log.sync, {db}) for db in range(self._log.databases)]

    def close(self) -> None:
        self._io.close()
        self._log.close()

    def statistics(self) -> CardStatistics:
        return CardStatistics(
            values=len(self.index),
            used_bytes=self._log.used_bytes,
            capacity_bytes=self._log.capacity_bytes,
            reclaims=self._log.reclaims,
            tombstones=self._catalog.tombstones,
            verify_failures=self._verify_failures,
        )


def _open(config: SoftwareCardConfig, context: CardContext) -> SoftwareCard:
    assert config.capacity is not None
    paths = config.database_paths
    per_database = config.capacity // len(paths)
    devices: list[DeviceHealth] = []
    holder: list[SoftwareCard] = []
    try:
        for database, path in enumerate(paths):
            device = FileDevice(path, per_database, grow=path not in config.devices)
            devices.append(DeviceHealth(wrap_device(device), database, path))
        region_log = RegionLog(
            list(devices),
            config.region_size,
            lambda *region: holder[0].on_reclaim(*region),
            Pools(config.region_quotas()),
            durable_fillings=config.sync != "none",
            ranking=Ranking(config.eviction),
        )
    except BaseException:  # a refused start: let go of the databases (their locks) at once
        for opened in devices:
            opened.close()
        raise
    card = SoftwareCard(
        region_log,
        config.fragment_size,  # the value size
        sync=config.sync == "always",
        on_written=context.on_written,
        prepare=config.prepare_databases,
        holdings=context.holdings,
        health=devices,
    )
    holder.append(card)
    return card
