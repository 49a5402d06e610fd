"""The in-memory index: (tenant, key) -> manifest. EXISTS is answered from here, never from disk.

Thread-safe. ``holdings`` (card/holdings.py) hears of every key the index gains or loses.
``members`` maps each region to the objects with a fragment in it, so reclaiming a
region forgets exactly those objects (and only if they still live in that region's epoch).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterator
from typing import NamedTuple

from adp_gateway.card.holdings import NO_HOLDINGS, Holdings
from adp_gateway.card.software.regions import Location

ObjectId = tuple[str, str]  # (tenant, key)


class Manifest(NamedTuple):  # a tuple: a restart makes one per object, fast
    seq: int
    object_bytes: int
    fragment_bytes: int  # every fragment but the last is this long
    locations: tuple[Location, ...]  # fragment i at locations[i]


class Index:
    """Objects are kept per tenant (tenant -> key -> manifest), so a lookup of many keys is one
    dict probe per key, without building a (tenant, key) tuple for each."""

    def __init__(self, holdings: Holdings = NO_HOLDINGS) -> None:
        self._lock = threading.Lock()
        self._objects = _Objects(holdings)
        # Region -> the objects with a fragment there. Built at the first reclaim after a
        # recovery rather than during it, so a restart answers lookups sooner.
        self._members: dict[tuple[int, int], set[ObjectId]] | None = defaultdict(set)

    def __len__(self) -> int:
        return len(self._objects)

    def get(self, object_id: ObjectId) -> Manifest | None:
        return self._objects.get(object_id)

    def contains(self, tenant: str, keys: list[str]) -> list[bool]:
        objects = self._objects.of(tenant)
        return list(map(objects.__contains__, keys))

    def load(self, tenants: dict[str, dict[str, Manifest]]) -> None:
        """Take a recovery's objects (tenant -> key -> manifest) as they are: the index is
        empty and nobody reads it yet."""
        with self._lock:
            self._objects.load(tenants)
            self._members = None

    def put(self, object_id: ObjectId, manifest: Manifest) -> Manifest | None:
        """Publish ``manifest`` unless a newer one is there already (recovery sees any order).

        Returns the manifest that is no longer in use: the one replaced, or ``manifest`` itself
        when a newer one stays; None when the key was new.
        """
        with self._lock:
            old = self._objects.get(object_id)
            if old is not None and old.seq > manifest.seq:
                return manifest
            if old is not None:
                self._forget_members(object_id, old)
            self._objects[object_id] = manifest
            if self._members is not None:
                for location in manifest.locations:
                    self._members[(location.database, location.region)].add(object_id)
            return old

    def remove(self, object_id: ObjectId, seq: int | None = None) -> Manifest | None:
        """Drop the object (only the version ``seq`` when given); return what was dropped."""
        with self._lock:
            old = self._objects.get(object_id)
            if old is None or (seq is not None and old.seq != seq):
                return None
            del self._objects[object_id]
            self._forget_members(object_id, old)
            return old

    def reclaim(self, database: int, region: int, epoch: int) -> list[Manifest]:
        """Forget every object with a fragment in this region's epoch; return their manifests."""
        with self._lock:
            dropped = []
            for object_id in self._region_members().pop((database, region), set()):
                manifest = self._objects.get(object_id)
                if manifest is None:
                    continue
                if any(
                    loc.database == database and loc.region == region and loc.epoch == epoch
                    for loc in manifest.locations
                ):
                    del self._objects[object_id]
                    self._forget_members(object_id, manifest)
                    dropped.append(manifest)
            return dropped

    def _region_members(self) -> dict[tuple[int, int], set[ObjectId]]:
        if self._members is None:
            self._members = defaultdict(set)
            for object_id, manifest in self._objects.items():
                for location in manifest.locations:
                    self._members[(location.database, location.region)].add(object_id)
        return self._members

    def _forget_members(self, object_id: ObjectId, manifest: Manifest) -> None:
        if self._members is None:
            return
        for location in manifest.locations:
            members = self._members.get((location.database, location.region))
            if members is not None:
                members.discard(object_id)


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

    def get(self, object_id: ObjectId) -> Manifest | None:
        return self.of(object_id[0]).get(object_id[1])

    def __setitem__(self, object_id: ObjectId, manifest: Manifest) -> None:
        objects = self._tenants.setdefault(object_id[0], {})
        if object_id[1] not in objects:
            self._count += 1
            self._holdings.added(*object_id)
        objects[object_id[1]] = manifest

    def items(self) -> Iterator[tuple[ObjectId, Manifest]]:
        for tenant, objects in self._tenants.items():
            for key, manifest in objects.items():
                yield (tenant, key), manifest

    def __delitem__(self, object_id: ObjectId) -> None:
        del self._tenants[object_id[0]][object_id[1]]
        self._count -= 1
        self._holdings.removed(*object_id)


_EMPTY: dict[str, Manifest] = {}
