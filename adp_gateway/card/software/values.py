"""Values on the software card's databases, as records: written and read in parallel (a thread
pool per database, so a stalled drive cannot hold up another's), and each read back checked
against what the index says before anyone trusts it. A value is one record; the index's
manifests can list several (records of the layout before the fragment-level card, when an
object's fragments were the card's business), and a read handles both."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TypeVar

from adp_gateway.card.base import Value
from adp_gateway.card.software.format import Kind, RecordHeader
from adp_gateway.card.software.index import Manifest, ValueId
from adp_gateway.card.software.regionlog import Location, RegionLog
from adp_gateway.errors import StorageError
from adp_wire.checksum import checksum
from adp_wire.ring.layout import align_up
from adp_wire.threads import name_pool_thread

log = logging.getLogger(__name__)
_T = TypeVar("_T")


class ValueIO:
    def __init__(self, region_log: RegionLog) -> None:
        self._log = region_log
        # Fragment I/O on every database but the caller's own, so one object uses every drive.
        self._fragment_io = [
            ThreadPoolExecutor(
                max_workers=4, thread_name_prefix=f"fragment-io-{d}", initializer=name_pool_thread
            )
            for d in range(region_log.databases)
        ]

    def write(self, namespace: str, seq: int, values: list[Value]) -> list[Location]:
        """Write each value as a record of version ``seq`` (its checksum computed here unless
        the client's came with it), each database's values together and the databases in
        parallel; return where each landed. Raises StorageError."""

        def header_of(value: Value) -> RecordHeader:
            payload = value.payload[: value.length]
            return RecordHeader(
                Kind.DATA,
                seq,
                namespace,
                value.name,
                value.length,
                0,
                value.length,
                0,
                1,
                checksum(payload) if value.checksum is None else value.checksum,
            )

        groups: dict[int, list[int]] = defaultdict(list)  # database -> the values' numbers
        for number, value in enumerate(values):
            groups[value.database].append(number)

        def write(database: int) -> list[Location]:
            records: list[tuple[RecordHeader, memoryview | None]] = [
                (header_of(values[n]), values[n].payload[: align_up(values[n].length)])
                for n in groups[database]
            ]
            return self._log.append_many(database, records)

        written = self.each_database(write, list(groups))
        placed = {
            number: location
            for database, numbers in groups.items()
            for number, location in zip(numbers, written[database], strict=True)
        }
        return [placed[n] for n in range(len(values))]

    def read(self, objects: list[tuple[Manifest, memoryview]]) -> list[list[RecordHeader | None]]:
        """Each object's fragment headers, its payloads read into its extent: all fragments of
        a database in one call, in disk order (records that lie back to back, such as objects
        stored one after another, share a vectored read), the databases in parallel. Raises
        StorageError."""
        if not objects:
            return []
        groups: dict[int, list[tuple[int, int]]] = defaultdict(list)  # (object, fragment)
        for number, (manifest, _) in enumerate(objects):
            for index, location in enumerate(manifest.locations):
                groups[location.database].append((number, index))
        for fragments in groups.values():
            fragments.sort(key=lambda f: objects[f[0]][0].locations[f[1]].offset)

        def read(database: int) -> list[RecordHeader | None]:
            locations: list[Location] = []
            payloads: list[memoryview | None] = []
            for number, index in groups[database]:
                manifest, extent = objects[number]
                offset = index * manifest.fragment_bytes
                length = min(manifest.fragment_bytes, manifest.object_bytes - offset)
                locations.append(manifest.locations[index])
                payloads.append(extent[offset : offset + align_up(length)])
            return self._log.read_many(locations, payloads)

        found = self.each_database(read, list(groups))
        headers: list[list[RecordHeader | None]] = [
            [None] * len(manifest.locations) for manifest, _ in objects
        ]
        for database, fragments in groups.items():
            for (number, index), header in zip(fragments, found[database], strict=True):
                headers[number][index] = header
        return headers

    def read_isolated(
        self, objects: list[tuple[Manifest, memoryview]], tenant: str
    ) -> list[list[RecordHeader | None] | None]:
        """``read``, with None for an object whose read failed (the device failed, maybe for a
        moment: the object is kept). Read together first; when that fails, each alone, so a
        failed read costs only its own objects."""
        try:
            return list(self.read(objects))
        except StorageError as exc:
            if len(objects) == 1:
                log.error("%s: %s", tenant, exc)
                return [None]
            log.warning("%s: %s; reading its %d objects one by one", tenant, exc, len(objects))
        return [self.read_isolated([one], tenant)[0] for one in objects]

    def each_database(self, work: Callable[[int], _T], databases: list[int]) -> dict[int, _T]:
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
        finally:  # whatever the caller's own raised: the op's extent is in use until they end
            wait(futures.values())
        for database, future in futures.items():
            try:
                results[database] = future.result()
            except StorageError as exc:
                failure = failure or exc
        if failure is not None:
            raise failure
        return results

    def close(self) -> None:
        for pool in self._fragment_io:
            pool.shutdown()


def intact(
    value_id: ValueId,
    manifest: Manifest,
    index: int,
    header: RecordHeader | None,
    extent: memoryview,
) -> bool:
    """Whether fragment ``index``, read into ``extent``, is what the index says."""
    offset = index * manifest.fragment_bytes
    length = min(manifest.fragment_bytes, manifest.object_bytes - offset)
    expected = (Kind.DATA, value_id[0], value_id[1], manifest.seq, index, offset, length)
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
            *value_id,
            index,
            manifest.locations[index],
        )
        return False
    if checksum(extent[offset : offset + length]) != header.payload_checksum:
        log.warning("%s/%s: fragment %d failed its checksum; reporting a miss", *value_id, index)
        return False
    return True
