"""The store: objects over the region log, with the in-memory index, recovery and delete.

Crash ordering: an object's fragments are written (and synced, under ``sync: always``) before its
manifest is published in the index; a delete removes the manifest first, then appends a
tombstone. On restart, ``recover`` rebuilds the index from the records on disk: the newest
complete version of each object wins unless a newer tombstone deletes it.

Every read is verified before it is reported loaded: each fragment's header must name the same
tenant, key, version and position, and its payload must match its checksum. Anything else is a
miss, logged, and the object is dropped from the index (invariant 1).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from gateway import fragmenter
from gateway.backends.regionlog import Location, RegionLog
from gateway.errors import StorageError
from gateway.format import Kind, RecordHeader, checksum, key_hash
from gateway.index import Index, Manifest, ObjectId
from gateway.ring.layout import align_up

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoreStatistics:
    objects: int
    used_bytes: int
    capacity_bytes: int
    loads: int
    load_misses: int
    stores: int
    stores_skipped: int
    verify_failures: int


class Store:
    def __init__(self, region_log: RegionLog, fragment_bytes_max: int, sync: bool) -> None:
        self._log = region_log
        self._fragment_bytes_max = fragment_bytes_max
        self._sync = sync
        self.index = Index()
        self._seq = itertools.count(1)
        self._seq_lock = threading.Lock()
        self._counts: dict[str, int] = defaultdict(int)

    def on_reclaim(self, database: int, region: int, epoch: int) -> None:
        dropped = self.index.reclaim(database, region, epoch)
        log.debug("reclaimed database %d region %d: %d objects evicted", database, region, dropped)

    def exists(self, tenant: str, keys: list[str]) -> list[bool]:
        return self.index.contains(tenant, keys)

    def put(self, tenant: str, key: str, extent: memoryview, object_bytes: int) -> None:
        """Persist ``extent[:object_bytes]``; ``extent`` is page aligned and padded to 4 KiB.

        An object already stored with the same length is not written again: keys name content
        (LMCache's chunk hashes), so the bytes are the same.
        """
        existing = self.index.get((tenant, key))
        if existing is not None and existing.object_bytes == object_bytes:
            self._counts["stores_skipped"] += 1
            return
        extent[object_bytes:] = bytes(len(extent) - object_bytes)  # no stray bytes on disk
        seq = self._next_seq()
        plan = fragmenter.plan(
            object_bytes, self._fragment_bytes_max, self._log.databases, key_hash(tenant, key)
        )
        locations = []
        for fragment in plan:
            payload = extent[fragment.offset : fragment.offset + fragment.length]
            header = RecordHeader(
                Kind.DATA,
                seq,
                tenant,
                key,
                object_bytes,
                fragment.offset,
                fragment.length,
                fragment.number,
                len(plan),
                checksum(payload),
            )
            padded = extent[fragment.offset : fragment.offset + align_up(fragment.length)]
            locations.append(self._log.append(fragment.database, header, padded))
        if self._sync:
            self._log.sync({loc.database for loc in locations})
        manifest = Manifest(seq, object_bytes, self._fragment_bytes_max, tuple(locations))
        self.index.put((tenant, key), manifest)
        self._counts["stores"] += 1

    def get(self, tenant: str, key: str, extent: memoryview, object_bytes: int) -> bool:
        """Read the object into ``extent``; True only when every byte was verified."""
        self._counts["loads"] += 1
        manifest = self.index.get((tenant, key))
        if manifest is None or manifest.object_bytes != object_bytes:
            self._counts["load_misses"] += 1
            return False
        for index, location in enumerate(manifest.locations):
            if not self._read_fragment((tenant, key), manifest, index, location, extent):
                self._counts["verify_failures"] += 1
                self._counts["load_misses"] += 1
                self.index.remove((tenant, key), manifest.seq)
                return False
        return True

    def delete(self, tenant: str, keys: Iterable[str]) -> list[bool]:
        results = []
        synced: set[int] = set()
        for key in keys:
            manifest = self.index.remove((tenant, key))
            results.append(manifest is not None)
            if manifest is None:
                continue
            tombstone = RecordHeader(Kind.TOMBSTONE, self._next_seq(), tenant, key, 0)
            # Same database as fragment 0: region FIFO there reclaims the data no later than this.
            database = manifest.locations[0].database
            self._log.append(database, tombstone, None)
            synced.add(database)
        if self._sync and synced:
            self._log.sync(synced)
        return results

    def recover(self) -> int:
        """Rebuild the index from disk; returns the number of objects found."""
        fragments: dict[tuple[ObjectId, int], dict[int, tuple[Location, RecordHeader]]] = (
            defaultdict(dict)
        )
        tombstones: dict[ObjectId, int] = {}
        top_seq = 0
        for location, header in self._log.scan():
            top_seq = max(top_seq, header.seq)
            object_id = (header.tenant, header.key)
            if header.kind == Kind.TOMBSTONE:
                tombstones[object_id] = max(tombstones.get(object_id, 0), header.seq)
            else:
                fragments[(object_id, header.seq)][header.fragment_index] = (location, header)
        for (object_id, seq), parts in fragments.items():
            manifest = _complete_manifest(seq, parts)
            if manifest is not None and tombstones.get(object_id, 0) < seq:
                self.index.put(object_id, manifest)
        with self._seq_lock:
            self._seq = itertools.count(top_seq + 1)
        return len(self.index)

    def close(self) -> None:
        self._log.sync(set(range(self._log.databases)))
        self._log.close()

    def statistics(self) -> StoreStatistics:
        return StoreStatistics(
            objects=len(self.index),
            used_bytes=self._log.used_bytes,
            capacity_bytes=self._log.capacity_bytes,
            loads=self._counts["loads"],
            load_misses=self._counts["load_misses"],
            stores=self._counts["stores"],
            stores_skipped=self._counts["stores_skipped"],
            verify_failures=self._counts["verify_failures"],
        )

    def _read_fragment(
        self,
        object_id: ObjectId,
        manifest: Manifest,
        index: int,
        location: Location,
        extent: memoryview,
    ) -> bool:
        offset = index * manifest.fragment_bytes
        length = min(manifest.fragment_bytes, manifest.object_bytes - offset)
        padded = extent[offset : offset + align_up(length)]
        try:
            header = self._log.read(location, padded)
        except StorageError as exc:
            log.error("%s/%s: %s", *object_id, exc)
            return False
        expected = (Kind.DATA, object_id[0], object_id[1], manifest.seq, index, offset, length)
        if header is None or expected != (
            header.kind,
            header.tenant,
            header.key,
            header.seq,
            header.fragment_index,
            header.fragment_offset,
            header.fragment_bytes,
        ):
            log.warning(
                "%s/%s: fragment %d at %s is not what the index says; reporting a miss",
                *object_id,
                index,
                location,
            )
            return False
        if checksum(padded[:length]) != header.payload_checksum:
            log.warning(
                "%s/%s: fragment %d failed its checksum; reporting a miss", *object_id, index
            )
            return False
        return True

    def _next_seq(self) -> int:
        with self._seq_lock:
            return next(self._seq)


def _complete_manifest(
    seq: int, parts: dict[int, tuple[Location, RecordHeader]]
) -> Manifest | None:
    """The manifest of one object version, or None when a fragment is missing."""
    first = next(iter(parts.values()))[1]
    if len(parts) != first.fragment_count:
        return None
    if any(h.object_bytes != first.object_bytes for _, h in parts.values()):
        return None
    if set(parts) != set(range(first.fragment_count)):
        return None
    locations = tuple(parts[i][0] for i in range(first.fragment_count))
    fragment_bytes = parts[0][1].fragment_bytes if first.fragment_count > 1 else first.object_bytes
    return Manifest(seq, first.object_bytes, max(fragment_bytes, 1), locations)
