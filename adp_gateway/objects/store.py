"""The object store: what the gateway's sessions store through. An object of a tenant is split
by the fragment plan (adp_wire/fragmenter.py) into values of at most the card's value size, put
on the card's databases in the tenant's namespace, and published in the catalog once every one
is on the card.

Crash ordering: a version's fragments are on the card (durable, as the config's ``sync`` says)
before the catalog publishes it; an overwrite with another length deletes the old version
before it writes the new one, so the old one never comes back; a recovery rebuilds the catalog
from the card's values alone (catalog.py). Every load is verified by the card: a fragment that is
not exactly what was put is a miss, and the object is dropped (invariant 1).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Protocol

from adp_gateway.card.base import Card, CardContext, Value, Wanted
from adp_gateway.card.loader import open_card
from adp_gateway.config import GatewayConfig
from adp_gateway.errors import StoreGivenUp
from adp_gateway.objects.catalog import ObjectCatalog
from adp_gateway.objects.names import Version, fragment_name
from adp_gateway.policy.admission import Admission, AdmissionSettings, AdmissionStatistics
from adp_gateway.policy.admission import settings_for as admission_settings_for
from adp_wire import fragmenter
from adp_wire.checksum import key_hash  # places an object's first fragment
from adp_wire.presence import fingerprint
from adp_wire.ring.layout import align_up

log = logging.getLogger(__name__)
Load = tuple[str, memoryview, int]  # key, the extent to read into, object bytes


class FromL1(Protocol):
    """A store the gateway reads out of the client's L1 itself (adp_gateway/sessions/extents.py): a
    zero-copy store's pages (``L1Object``), or a remote copy's buffer (``RemoteObject``)."""

    @property
    def written_from_l1(self) -> bool:
        """Whether the card writes the object from L1 itself (else from the extent)."""
        ...

    def checksums(self, extent: memoryview, spans: list[tuple[int, int]]) -> list[int]:
        """The payload checksum of each ``(offset, length)`` span of the object, in order; a
        remote copy first copies the object into ``extent``."""
        ...

    def given_up(self) -> bool:
        """Whether the client has given the store up: LMCache may rewrite the buffer."""
        ...


@dataclasses.dataclass(frozen=True)
class StoreStatistics:
    objects: int
    used_bytes: int
    capacity_bytes: int
    loads: int
    load_misses: int
    stores: int
    stores_skipped: int
    verify_failures: int
    reclaims: int  # evictions of a region (software card) or a value (memory card)
    tombstones: int


class ObjectStore:
    def __init__(
        self, card: Card, catalog: ObjectCatalog, admission: Admission | None = None
    ) -> None:
        """``catalog`` must be the holdings ``card`` was opened with (``open_store`` does it);
        ``admission`` decides which stores are written (none: every one)."""
        self.card = card
        self._catalog = catalog
        self._admission = admission or Admission(AdmissionSettings(enabled=False), 0.0)
        self._counts: Counter[str] = Counter()
        self._counts_lock = threading.Lock()  # the I/O threads count at once

    @property
    def persistent(self) -> bool:
        return type(self.card).persistent

    @property
    def databases(self) -> int:
        return self.card.databases

    @property
    def fragment_bytes(self) -> int:
        return self.card.value_bytes

    def fragment_plan(self, tenant: str, key: str, object_bytes: int) -> list[fragmenter.Fragment]:
        """Where each fragment of this object goes."""
        return fragmenter.plan(
            object_bytes, self.fragment_bytes, self.databases, key_hash(tenant, key)
        )

    def databases_to_store(self, tenant: str, key: str, object_bytes: int) -> frozenset[int]:
        """The databases a store of this object writes (for the scheduler)."""
        return frozenset(f.database for f in self.fragment_plan(tenant, key, object_bytes))

    def databases_holding(self, tenant: str, keys: list[str]) -> frozenset[int]:
        """The databases a load or delete of these objects touches (for the scheduler)."""
        return self.card.databases_holding(tenant, self._names(tenant, keys))

    def version(self, tenant: str, key: str) -> Version | None:
        """The version of the object held, if any (tools and tests look where it lies)."""
        return self._catalog.get(tenant, key)

    def exists(self, tenant: str, keys: list[str]) -> list[bool]:
        return self._catalog.contains(tenant, keys)

    def pool_bytes(self, tenant: str) -> tuple[int, int]:
        return self.card.pool_bytes(tenant)

    def admit(self, tenant: str, key: str, object_bytes: int) -> bool:
        """Whether a store of this object should be written (adp_gateway/policy/admission.py);
        a store of an object held already (which ``put`` would not write) only counts as a
        sighting of its key. A store that replaces a held object of another length is always
        written: declined, it would leave the replaced version to be found."""
        current = self._catalog.get(tenant, key)
        if current is not None and current.object_bytes != object_bytes:
            return True
        held = current is not None
        try:
            print_ = fingerprint(f"{tenant}/{key}")
            age = self.card.eviction_age_s()
            # The cost is a plan and a name per fragment: only what admission will weigh.
            weighed = self._admission.settings.enabled and not held
            cost = self.write_cost(tenant, key, object_bytes) if weighed else object_bytes
            now_s = time.monotonic()
            return self._admission.admit(print_, object_bytes, now_s, age, held, cost)
        except Exception:  # a bug in a policy must not cost the store, nor the session
            log.exception("admission failed; the store is written")
            return True

    def write_cost(self, tenant: str, key: str, object_bytes: int) -> int:
        """What a put of this object would write to the card's devices (the write budget's
        charge)."""
        plan = self.fragment_plan(tenant, key, object_bytes)
        version = Version(0, object_bytes, self.fragment_bytes, len(plan))  # numbered at put
        return sum(
            self.card.write_cost(tenant, fragment_name(key, version, f.number), f.length)
            for f in plan
        )

    def admission_statistics(self) -> AdmissionStatistics:
        return self._admission.statistics(time.monotonic())

    def put(
        self,
        tenant: str,
        key: str,
        extent: memoryview,
        object_bytes: int,
        l1: FromL1 | None = None,
    ) -> None:
        """Persist ``extent[:object_bytes]``; ``extent`` is page aligned and padded to 4 KiB.

        With ``l1`` the gateway reads the object out of the client's L1 itself. Its payload
        checksums come from ``l1`` first (a remote copy fills ``extent`` on the way), then
        ``l1.given_up()`` says whether the client has given the store up, in which case this
        raises StoreGivenUp and writes nothing. Otherwise the checksums are of the bytes the
        client stored. A zero-copy store's ``extent`` is L1 itself, never written or padded
        here, and the card reads it as it writes: ``l1.given_up()`` is asked again once it
        has, and a store given up by then (LMCache may have rewritten the buffer while the card
        read it) is deleted unpublished, with StoreGivenUp. So no version whose bytes may have
        changed under its write is ever found; were one found (a crash between the write and
        the delete), its first load would fail the checksums and drop it.

        An object already stored with the same length is not written again: keys name content
        (LMCache's chunk hashes), so the bytes are the same. Raises StorageError, with nothing
        published, when the card fails.
        """
        current = self._catalog.get(tenant, key)
        if current is not None and current.object_bytes == object_bytes:
            self._count("stores_skipped")
            return
        if current is not None:
            self._drop(tenant, [(key, current)])  # before the new version: it never returns
        plan = self.fragment_plan(tenant, key, object_bytes)
        checksums: list[int | None] = [None] * len(plan)  # taken by the card as it writes
        if l1 is not None:
            spans = sorted((f.offset, f.length, f.number) for f in plan)
            taken = l1.checksums(extent, [(offset, length) for offset, length, _ in spans])
            for (_, _, number), value in zip(spans, taken, strict=True):
                checksums[number] = value
            if l1.given_up():
                raise StoreGivenUp(f"the client gave the store of {tenant}/{key} up")
        if l1 is None or not l1.written_from_l1:
            extent[object_bytes:] = bytes(len(extent) - object_bytes)  # no stray bytes on disk
        version = Version(self._catalog.next_number(), object_bytes, self.fragment_bytes, len(plan))
        values = [
            Value(
                f.database,
                fragment_name(key, version, f.number),
                extent[f.offset : f.offset + align_up(f.length)],
                f.length,
                checksums[f.number],
            )
            for f in plan
        ]
        self.card.put(tenant, values)
        if l1 is not None and l1.written_from_l1 and l1.given_up():
            self.card.delete(tenant, version.names(key))
            raise StoreGivenUp(
                f"the client gave the store of {tenant}/{key} up while it was written"
            )
        unused = self._catalog.publish(tenant, key, version)
        if unused is not None:  # another put of this key ran at the same time
            self.card.delete(tenant, unused.names(key))
        self._count("stores")

    def get(self, tenant: str, key: str, extent: memoryview, object_bytes: int) -> bool:
        """Read the object into ``extent``; True only when every byte was verified."""
        return self.get_many(tenant, [(key, extent, object_bytes)])[0]

    def get_many(self, tenant: str, objects: list[Load]) -> list[bool]:
        """Each object into its extent, all in one call to the card (fragments that lie back to
        back on a database may share a read); True where every byte was verified. An object
        with a fragment the card no longer holds is dropped."""
        wanted: list[Wanted] = []
        reads: list[tuple[int, str, Version, int]] = []  # object, key, version, first value
        for number, (key, extent, object_bytes) in enumerate(objects):
            version = self._catalog.get(tenant, key)
            if version is None or version.object_bytes != object_bytes:
                continue
            reads.append((number, key, version, len(wanted)))
            for place in range(version.fragments):
                offset, length = version.span(place)
                into = extent[offset : offset + align_up(length)]
                wanted.append(Wanted(fragment_name(key, version, place), into, length))
        got = self.card.get(tenant, wanted) if wanted else []
        found = [False] * len(objects)
        now_s = time.monotonic()
        for number, key, version, first in reads:
            found[number] = all(got[first : first + version.fragments])
            if found[number]:
                self._admission.sighted(fingerprint(f"{tenant}/{key}"), now_s)
            if not found[number] and not all(self.card.exists(tenant, version.names(key))):
                self._catalog.remove(tenant, key, version.number)  # evicted as it was published
        self._count("loads", len(objects))
        self._count("load_misses", found.count(False))
        return found

    def delete(self, tenant: str, keys: Iterable[str]) -> list[bool]:
        """Per key, whether it was held; durable when it returns (as ``sync`` says)."""
        held = [(key, self._catalog.get(tenant, key)) for key in keys]
        return self._drop(tenant, held)

    def recover(self) -> int:
        """Rebuild the catalog from the card; returns the number of objects found."""
        self.card.recover()
        stale = self._catalog.take_stale()
        for tenant, names in stale.items():
            self.card.delete(tenant, names)
        if stale:
            # Durable before anything else happens: once the newer version goes, a stale one
            # must not be found whole by the next recovery, whatever the config's ``sync``.
            self.card.sync_all()
        return len(self._catalog)

    def sync_all(self) -> None:
        self.card.sync_all()

    def syncs(self) -> list[Callable[[], None]]:
        return self.card.syncs()

    def close(self) -> None:
        self.card.close()

    def statistics(self) -> StoreStatistics:
        card = self.card.statistics()
        with self._counts_lock:
            counts = dict(self._counts)
        return StoreStatistics(
            objects=len(self._catalog),
            used_bytes=card.used_bytes,
            capacity_bytes=card.capacity_bytes,
            loads=counts.get("loads", 0),
            load_misses=counts.get("load_misses", 0),
            stores=counts.get("stores", 0),
            stores_skipped=counts.get("stores_skipped", 0),
            verify_failures=card.verify_failures,
            reclaims=card.reclaims,
            tombstones=card.tombstones,
        )

    def _drop(self, tenant: str, objects: list[tuple[str, Version | None]]) -> list[bool]:
        """Delete these versions' fragments from the card, all in one call (the card drops
        each object from the catalog as it lets its fragments go); per object, whether it was
        held. Raises StorageError, nothing dropped, when the card cannot record it."""
        names = [version.names(key) if version else [] for key, version in objects]
        deleted = iter(self.card.delete(tenant, [name for group in names for name in group]))
        results = []
        for (key, version), group in zip(objects, names, strict=True):
            gone = [next(deleted) for _ in group]
            if version is not None:
                self._catalog.remove(tenant, key, version.number)  # had it been evicted already
            results.append(any(gone))
        return results

    def _names(self, tenant: str, keys: list[str]) -> list[str]:
        versions = ((key, self._catalog.get(tenant, key)) for key in keys)
        return [name for key, version in versions if version for name in version.names(key)]

    def _count(self, name: str, increment: int = 1) -> None:
        with self._counts_lock:
            self._counts[name] += increment


def open_store(config: GatewayConfig, context: CardContext) -> ObjectStore:
    """A store over the card the config names (card/loader.py), not yet recovered;
    ``context.holdings`` hears of the objects it holds."""
    catalog = ObjectCatalog(context.holdings)
    card = open_card(config, dataclasses.replace(context, holdings=catalog))
    admission = Admission(admission_settings_for(config), time.monotonic())
    return ObjectStore(card, catalog, admission)
