"""The store: objects over the region log, with the in-memory index, recovery and delete.

Crash ordering: an object's fragments are written (and synced, under ``sync: always``) before its
manifest is published in the index; a delete removes the manifest first, then appends a
tombstone, and so does an overwrite with another length before it writes the new version. On
restart, ``recover`` rebuilds the index from the records on disk: the newest complete version of
each object wins unless a newer tombstone deletes it. Tombstones outlive the records they shadow
(adp_gateway/tombstones.py).

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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Never, TypeVar

from tqdm import tqdm

from adp_gateway import fragmenter
from adp_gateway.backends.regionlog import Location, RegionLog
from adp_gateway.checksum import checksum
from adp_gateway.errors import StorageError
from adp_gateway.format import HEADER_BYTES, Kind, RecordHeader, key_hash
from adp_gateway.index import Index, Manifest, ObjectId
from adp_gateway.ring.layout import PAGE_BYTES, align_up
from adp_gateway.tombstones import Tombstones

log = logging.getLogger(__name__)
_T = TypeVar("_T")


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
    reclaims: int
    tombstones: int


class Store:
    def __init__(
        self,
        region_log: RegionLog,
        fragment_bytes_max: int,
        sync: bool,
        on_written: Callable[[], None] | None = None,
    ) -> None:
        """``sync``: a store returns once an fdatasync covers it (else once written).
        ``on_written`` is called by a store's thread when its writes have landed, before it
        waits for that sync (the scheduler then lets the next store's writes go)."""
        self._log = region_log
        self._fragment_bytes_max = fragment_bytes_max
        self._sync = sync
        self._on_written = on_written or (lambda: None)
        self.index = Index()
        self._seq = itertools.count(1)
        self._seq_lock = threading.Lock()
        self._counts: dict[str, int] = defaultdict(int)
        self._tombstones = Tombstones()
        self._tombstones_lock = threading.Lock()
        # Fragment I/O on every database but the caller's own, so one object uses every drive;
        # a pool per database, so a stalled one cannot hold up another's.
        self._fragment_io = [
            ThreadPoolExecutor(max_workers=4, thread_name_prefix=f"fragment-io-{d}")
            for d in range(region_log.databases)
        ]

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

    def databases_to_store(self, tenant: str, key: str, object_bytes: int) -> frozenset[int]:
        """The databases a store of this object writes (for the scheduler)."""
        plan = fragmenter.plan(
            object_bytes, self._fragment_bytes_max, self._log.databases, key_hash(tenant, key)
        )
        return frozenset(fragment.database for fragment in plan)

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
        plan = fragmenter.plan(
            object_bytes, self._fragment_bytes_max, self._log.databases, key_hash(tenant, key)
        )
        groups: dict[int, list[fragmenter.Fragment]] = defaultdict(list)
        for fragment in plan:
            groups[fragment.database].append(fragment)

        def write(database: int) -> list[Location]:
            records: list[tuple[RecordHeader, memoryview | None]] = []
            for fragment in groups[database]:
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
                    checksum(payload) if checksums is None else checksums[fragment.number],
                )
                padded = extent[fragment.offset : fragment.offset + align_up(fragment.length)]
                records.append((header, padded))
            return self._log.append_many(database, records)

        written = self._each_database(write, list(groups))
        placed = {
            fragment.number: location
            for database, fragments in groups.items()
            for fragment, location in zip(fragments, written[database], strict=True)
        }
        locations = [placed[i] for i in range(len(plan))]
        self._on_written()
        if self._sync:
            self._log.sync(synced | {loc.database for loc in locations})
        manifest = Manifest(seq, object_bytes, self._fragment_bytes_max, tuple(locations))
        self._publish((tenant, key), manifest)
        self._counts["stores"] += 1

    @property
    def fragment_bytes(self) -> int:
        return self._fragment_bytes_max

    def fragment_count(self, object_bytes: int) -> int:
        """How many fragments (and checksums) an object of ``object_bytes`` is stored as."""
        return fragmenter.count(object_bytes, self._fragment_bytes_max)

    def get(self, tenant: str, key: str, extent: memoryview, object_bytes: int) -> bool:
        """Read the object into ``extent``; True only when every byte was verified."""
        return self._load(tenant, key, extent, object_bytes, None)

    def get_unverified(
        self, tenant: str, key: str, extent: memoryview, object_bytes: int
    ) -> list[int] | None:
        """A zero-copy load: read the object into ``extent`` (the client's L1), check every
        fragment's header, and return the payload checksums the client must verify before it
        reports the load; None for a miss. The gateway never reads L1 itself."""
        checksums: list[int] = []
        return checksums if self._load(tenant, key, extent, object_bytes, checksums) else None

    def _load(
        self,
        tenant: str,
        key: str,
        extent: memoryview,
        object_bytes: int,
        checksums: list[int] | None,
    ) -> bool:
        self._counts["loads"] += 1
        manifest = self.index.get((tenant, key))
        if manifest is None or manifest.object_bytes != object_bytes:
            self._counts["load_misses"] += 1
            return False
        try:
            headers = self._read_fragments(manifest, extent)
        except StorageError as exc:  # the device failed, maybe for a moment: keep the object
            log.error("%s/%s: %s", tenant, key, exc)
            self._counts["load_misses"] += 1
            return False
        if None in headers and not all(map(self._log.is_current, manifest.locations)):
            self._counts["load_misses"] += 1  # evicted since it was looked up: a plain miss
            return False
        for index, header in enumerate(headers):
            if not self._intact((tenant, key), manifest, index, header, extent, checksums):
                self._counts["verify_failures"] += 1
                self._counts["load_misses"] += 1
                self._drop((tenant, key), manifest)
                return False
        return True

    def _read_fragments(self, manifest: Manifest, extent: memoryview) -> list[RecordHeader | None]:
        """Every fragment's header, its payload read into ``extent``; the databases in
        parallel. Raises StorageError."""
        groups: dict[int, list[int]] = defaultdict(list)
        for index, location in enumerate(manifest.locations):
            groups[location.database].append(index)

        def read(database: int) -> list[RecordHeader | None]:
            indexes = groups[database]
            payloads: list[memoryview | None] = []
            for index in indexes:
                offset = index * manifest.fragment_bytes
                length = min(manifest.fragment_bytes, manifest.object_bytes - offset)
                payloads.append(extent[offset : offset + align_up(length)])
            return self._log.read_many([manifest.locations[i] for i in indexes], payloads)

        found = self._each_database(read, list(groups))
        headers: list[RecordHeader | None] = [None] * len(manifest.locations)
        for database, indexes in groups.items():
            for index, header in zip(indexes, found[database], strict=True):
                headers[index] = header
        return headers

    def _each_database(self, work: Callable[[int], _T], databases: list[int]) -> dict[int, _T]:
        """``work`` for each database, in parallel when there are several (one object's
        fragments on several drives use them all at once). Raises the first StorageError."""
        if len(databases) == 1:
            return {databases[0]: work(databases[0])}
        futures = {d: self._fragment_io[d].submit(work, d) for d in databases[1:]}
        results: dict[int, _T] = {}
        failure: StorageError | None = None
        try:
            results[databases[0]] = work(databases[0])
        except StorageError as exc:
            failure = exc
        for database, future in futures.items():
            try:
                results[database] = future.result()
            except StorageError as exc:
                failure = failure or exc
        if failure is not None:
            raise failure
        return results

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
        """Rebuild the index from disk; returns the number of objects found.

        The newest complete version of each object wins, unless a newer tombstone deletes it.
        Written for speed (100,000 objects in well under a second): it works on footer rows
        and builds a Location and a Manifest only per record, nothing more.
        """
        best: dict[str, dict[str, Manifest]] = defaultdict(dict)  # tenant -> key -> newest
        older: dict[ObjectId, list[Manifest]] = defaultdict(list)  # complete, superseded
        fragmented: dict[tuple[ObjectId, int], dict[int, _Fragment]] = defaultdict(dict)
        tombstones: dict[ObjectId, tuple[int, Location]] = {}
        top_seq = 0
        new = tuple.__new__  # what a NamedTuple's constructor calls, without its Python frame
        for found in self._log.scan(_ProgressLog()):
            database, region, epoch, start = found.database, found.region, found.epoch, found.start
            for offset, kind, seq, tenant, key, size, at, length, index, count, _ in found.rows:
                if seq > top_seq:
                    top_seq = seq
                record_bytes = HEADER_BYTES + ((length + PAGE_BYTES - 1) & -PAGE_BYTES)
                location = new(Location, (database, region, epoch, start + offset, record_bytes))
                if kind == _DATA and count == 1:  # the common case, kept lean
                    manifest = new(Manifest, (seq, size, size or 1, (location,)))
                    objects = best[tenant]
                    current = objects.setdefault(key, manifest)
                    if current is not manifest:
                        _offer(objects, older, (tenant, key), manifest)
                elif kind == _DATA:
                    fragmented[((tenant, key), seq)][index] = (location, size, at, length, count)
                elif kind == _TOMBSTONE and tombstones.get((tenant, key), (0,))[0] < seq:
                    tombstones[(tenant, key)] = (seq, location)
        for (object_id, seq), fragments in fragmented.items():
            assembled = _assemble(seq, fragments)
            if assembled is not None:
                objects = best[object_id[0]]
                if objects.setdefault(object_id[1], assembled) is not assembled:
                    _offer(objects, older, object_id, assembled)
        for object_id, (seq, tombstone_at) in tombstones.items():
            shadowed = [loc for m in older.get(object_id, ()) if m.seq < seq for loc in m.locations]
            objects = best[object_id[0]]
            newest = objects.get(object_id[1])
            if newest is not None and newest.seq < seq:
                shadowed.extend(newest.locations)
                del objects[object_id[1]]
            if shadowed:
                self._tombstones.add(object_id, seq, tombstone_at, shadowed)
        self.index.load(best)
        self._log.retain(
            tuple(loc for objects in best.values() for m in objects.values() for loc in m.locations)
        )
        with self._seq_lock:
            self._seq = itertools.count(top_seq + 1)
        return len(self.index)

    def sync_all(self) -> None:
        """Make every write so far durable on every database."""
        self._log.sync(set(range(self._log.databases)))

    def close(self) -> None:
        for pool in self._fragment_io:
            pool.shutdown()
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
            reclaims=self._log.reclaims,
            tombstones=len(self._tombstones),
        )

    def _intact(
        self,
        object_id: ObjectId,
        manifest: Manifest,
        index: int,
        header: RecordHeader | None,
        extent: memoryview,
        checksums: list[int] | None,
    ) -> bool:
        """Whether fragment ``index``, read into ``extent``, is what the index says. With
        ``checksums`` its payload is the client's to verify: its checksum is appended there."""
        offset = index * manifest.fragment_bytes
        length = min(manifest.fragment_bytes, manifest.object_bytes - offset)
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
                manifest.locations[index],
            )
            return False
        if checksums is not None:
            checksums.append(header.payload_checksum)
            return True
        if checksum(extent[offset : offset + length]) != header.payload_checksum:
            log.warning(
                "%s/%s: fragment %d failed its checksum; reporting a miss", *object_id, index
            )
            return False
        return True

    def _next_seq(self) -> int:
        with self._seq_lock:
            return next(self._seq)


_DATA, _TOMBSTONE = int(Kind.DATA), int(Kind.TOMBSTONE)
_Fragment = tuple[Location, int, int, int, int]  # location, object bytes, offset, length, count


def _offer(
    objects: dict[str, Manifest],
    older: dict[ObjectId, list[Manifest]],
    object_id: ObjectId,
    manifest: Manifest,
) -> None:
    """A second complete version of one object: keep the newer in ``objects``, the other in
    ``older``."""
    current = objects[object_id[1]]
    if current.seq < manifest.seq:
        older[object_id].append(current)
        objects[object_id[1]] = manifest
    else:
        older[object_id].append(manifest)


def _assemble(seq: int, fragments: dict[int, _Fragment]) -> Manifest | None:
    """The manifest of one version from its fragments, or None when one is missing, they
    disagree, or they do not cover the object exactly (fragment i at i * fragment bytes)."""
    first = fragments.get(0)
    if first is None:
        return None
    _, size, _, fragment_bytes, count = first
    if set(fragments) != set(range(count)) or size > count * fragment_bytes:
        return None
    for i, (_, object_bytes, offset, length, fragment_count) in fragments.items():
        expected = (size, i * fragment_bytes, min(fragment_bytes, size - i * fragment_bytes), count)
        if expected[2] <= 0 or (object_bytes, offset, length, fragment_count) != expected:
            return None
    return Manifest(seq, size, fragment_bytes, tuple(fragments[i][0] for i in range(count)))


class _ProgressLog:
    """Logs a recovery's progress every few seconds, when it takes that long (tqdm, on a file
    that writes each refresh of the bar as a log line)."""

    def __init__(self) -> None:
        self._bar: tqdm[Never] | None = None

    def __call__(self, done: int, total: int) -> None:
        if self._bar is None:
            self._bar = tqdm(
                total=total,
                file=_LogLines(),
                bar_format="recovering: {n} of {total} regions read ({percentage:.0f} %), "
                "{elapsed} elapsed, {remaining} left",
                mininterval=5.0,
                delay=5.0,  # a fast recovery logs nothing
            )
        if done < total:
            self._bar.update(done - self._bar.n)
        else:
            self._bar.n = done  # close() logs the last line, once, if it logged any before
            self._bar.close()


class _LogLines:
    """A file for tqdm: each line it writes (it starts them with \\r) becomes a log line."""

    def write(self, text: str) -> int:
        if line := text.strip("\r\n "):
            log.info("%s", line)
        return len(text)

    def flush(self) -> None:
        pass
