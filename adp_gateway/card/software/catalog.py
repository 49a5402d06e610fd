"""What the software card holds, apart from the bytes: each value's current record (the index of
manifests), the tombstones that bury deleted and overwritten versions, and the sequence numbers
that order versions and tombstones on disk.

Crash ordering, which every change here keeps: a version is published only after its records
are written (the card's ``put``); ``drop`` appends the tombstone before it removes the version
from the index, so a restart never finds a version the index had already given up; tombstones
outlive the records they shadow (tombstones.py). ``recover`` rebuilds all of it from a scan of the
region log (recovery.py), and the log learns which records are in use (``retain``/``release``),
so eviction reclaims emptied regions before it evicts anything.
"""

from __future__ import annotations

import itertools
import logging
import threading

from adp_gateway.card.holdings import NO_HOLDINGS, Holdings
from adp_gateway.card.software.format import Kind, RecordHeader
from adp_gateway.card.software.index import Index, Manifest, ValueId
from adp_gateway.card.software.recovery import ProgressLog, rebuild
from adp_gateway.card.software.regionlog import RegionLog
from adp_gateway.card.software.tombstones import Tombstones

log = logging.getLogger(__name__)


class ValueCatalog:
    def __init__(self, region_log: RegionLog, holdings: Holdings = NO_HOLDINGS) -> None:
        self._log = region_log
        self.index = Index(holdings)
        self._seq = itertools.count(1)
        self._seq_lock = threading.Lock()
        self._tombstones = Tombstones()
        self._tombstones_lock = threading.Lock()

    @property
    def tombstones(self) -> int:
        return len(self._tombstones)

    def next_seq(self) -> int:
        with self._seq_lock:
            return next(self._seq)

    def publish(self, value_id: ValueId, manifest: Manifest) -> None:
        """Make ``manifest`` (its records written) the value's current one."""
        self._log.retain(manifest.locations)
        unused = self.index.put(value_id, manifest)
        if unused is not None:
            self._log.release(unused.locations)

    def drop(self, value_id: ValueId, manifest: Manifest) -> bool:
        """Bury this version under a tombstone, then remove it from the index, so that a restart
        agrees with the index; False when the index holds another version by now. Raises
        StorageError, with nothing changed, when the tombstone cannot be written."""
        tombstone = RecordHeader(Kind.TOMBSTONE, self.next_seq(), *value_id, 0)
        at = self._log.append(manifest.locations[0].database, tombstone, None)
        if self.index.remove(value_id, manifest.seq) is None:
            return False
        self._log.release(manifest.locations)
        with self._tombstones_lock:
            self._tombstones.add(value_id, tombstone.seq, at, manifest.locations)
        return True

    def on_reclaim(self, database: int, region: int, epoch: int) -> list[RecordHeader]:
        """The region log reclaims a region: forget its values, return tombstones to carry."""
        dropped = self.index.reclaim(database, region, epoch)
        for manifest in dropped:
            self._log.release(manifest.locations)
        with self._tombstones_lock:
            carried = self._tombstones.carry(database, region, self._log.on_disk)
        log.debug(
            "reclaimed database %d region %d: %d values evicted, %d tombstones carried",
            database,
            region,
            len(dropped),
            len(carried),
        )
        return carried

    def recover(self) -> int:
        """Rebuild the index and tombstones from the log's records (the first call, before any
        other); returns the number of values found."""
        top_seq = rebuild(
            self._log.scan(ProgressLog()), self.index, self._tombstones, self._log.retain
        )
        with self._seq_lock:
            self._seq = itertools.count(top_seq + 1)
        return len(self.index)
