"""The in-memory index of the software card: (namespace, name) -> manifest, where each value's
records are. ``exists`` is answered from here, never from disk.

Thread-safe. ``holdings`` (card/holdings.py) hears of every name the index gains or loses.
``members`` maps each region to the values with a record in it, so reclaiming a region forgets
exactly those values (and only if they still live in that region's epoch).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterator
from typing import NamedTuple

from adp_gateway.card.holdings import NO_HOLDINGS, Holdings
from adp_gateway.card.software.regions import Location

ValueId = tuple[str, str]  # (namespace, name)


class Manifest(NamedTuple):  # a tuple: a restart makes one per value, fast
    """Where a value's records are: one record (a value the object store put), or several
    (an object stored by the layout before the fragment-level card, fragment i at
    ``locations[i]``)."""

    seq: int
    object_bytes: int  # the value's length
    fragment_bytes: int  # every record's payload but the last is this long
    locations: tuple[Location, ...]


class Index:
    """Values are kept per namespace (namespace -> name -> manifest), so a lookup of many names
    is one dict probe per name, without building a (namespace, name) tuple for each."""

    def __init__(self, holdings: Holdings = NO_HOLDINGS) -> None:
        self._lock = threading.Lock()
        self._objects = _Objects(holdings)
        # Region -> the objects with a fragment there. Built at the first reclaim after a
        # recovery rather than during it, so a restart answers lookups sooner.
        self._members: dict[tuple[int, int], set[ValueId]] | None = defaultdict(set)

    def __len__(self) -> int:
        return len(self._objects)

    def get(self, value_id: ValueId) -> Manifest | None:
        return self._objects.get(value_id)

    def contains(self, tenant: str, keys: list[str]) -> list[bool]:
        objects = self._objects.of(tenant)
        return list(map(objects.__contains__, keys))

    def load(self, tenants: dict[str, dict[str, Manifest]]) -> None:
        """Take a recovery's objects (tenant -> key -> manifest) as they are: the index is
        empty and nobody reads it yet."""
        with self._lock:
            self._objects.load(tenants)
            self._members = None

    def put(self, value_id: ValueId, manifest: Manifest) -> Manifest | None:
        """Publish ``manifest`` unless a newer one is there already (recovery sees any order).

        Returns the manifest that is no longer in use: the one replaced, or ``manifest`` itself
        when a newer one stays; None when the key was new.
        """
        with self._lock:
            old = self._objects.get(value_id)
            if old is not None and old.seq > manifest.seq:
                return manifest
            if old is not None:
                self._forget_members(value_id, old)
            self._objects[value_id] = manifest
            if self._members is not None:
                for location in manifest.locations:
                    self._members[(location.database, location.region)].add(value_id)
            return old

    def remove(self, value_id: ValueId, seq: int | None = None) -> Manifest | None:
        """Drop the object (only the version ``seq`` when given); return what was dropped."""
        with self._lock:
            old = self._objects.get(value_id)
            if old is None or (seq is not None and old.seq != seq):
                return None
            del self._objects[value_id]
            self._forget_members(value_id, old)
            return old

    def reclaim(self, database: int, region: int, epoch: int) -> list[Manifest]:
        """Forget every object with a fragment in this region's epoch; return their manifests."""
        with self._lock:
            dropped = []
            for value_id in self._region_members().pop((database, region), set()):
                manifest = self._objects.get(value_id)
                if manifest is None:
                    continue
                if any(
                    loc.database == database and loc.region == region and loc.epoch == epoch
                    for loc in manifest.locations
                ):
                    del self._objects[value_id]
                    self._forget_members(value_id, manifest)
                    dropped.append(manifest)
            return dropped

    def _region_members(self) -> dict[tuple[int, int], set[ValueId]]:
        if self._members is None:
            self._members = defaultdict(set)
            for value_id, manifest in self._objects.items():
                for location in manifest.locations:
                    self._members[(location.database, location.region)].add(value_id)
        return self._members

    def _forget_members(self, value_id: ValueId, manifest: Manifest) -> None:
        if self._members is None:
            return
        for location in manifest.locations:
            members = self._members.get((location.database, location.region))
            if members is not None:
                members.discard(value_id)


class _Objects:
    """A mapping of (tenant, key) to manifest, stored as tenant -> key -> manifest."""

    def __init__(self, holdings: Holdings) -> None:
        self._tenants: dict[str, dict[str, Manifest]] = {}
        self._count = 0
        self._holdings = holdings

    def __len__(self) -> int:
        return self._count

    def load(self, tenants: dict[str, dict[str, Manifest]]) -> None:
        assert not self._count
        self._tenants = {tenant: objects for tenant, objects in tenants.items() if objects}
        self._count = sum(len(objects) for objects in self._tenants.values())
        for tenant, objects in self._tenants.items():
            self._holdings.recovered(tenant, objects)

    def of(self, tenant: str) -> dict[str, Manifest]:
        return self._tenants.get(tenant, _EMPTY)

    def get(self, value_id: ValueId) -> Manifest | None:
        return self.of(value_id[0]).get(value_id[1])

    def __setitem__(self, value_id: ValueId, manifest: Manifest) -> None:
        objects = self._tenants.setdefault(value_id[0], {})
        if value_id[1] not in objects:
            self._count += 1
            self._holdings.added(*value_id)
        objects[value_id[1]] = manifest

    def items(self) -> Iterator[tuple[ValueId, Manifest]]:
        for tenant, objects in self._tenants.items():
            for key, manifest in objects.items():
                yield (tenant, key), manifest

    def __delitem__(self, value_id: ValueId) -> None:
        del self._tenants[value_id[0]][value_id[1]]
        self._count -= 1
        self._holdings.removed(*value_id)


_EMPTY: dict[str, Manifest] = {}
