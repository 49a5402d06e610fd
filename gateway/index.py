"""The in-memory index: (tenant, key) -> manifest. EXISTS is answered from here, never from disk.

Thread-safe. ``members`` maps each region to the objects with a fragment in it, so reclaiming a
region forgets exactly those objects (and only if they still live in that region's epoch).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterable
from typing import NamedTuple

from gateway.backends.regionlog import Location

ObjectId = tuple[str, str]  # (tenant, key)


class Manifest(NamedTuple):  # a tuple: a restart makes one per object, fast
    seq: int
    object_bytes: int
    fragment_bytes: int  # every fragment but the last is this long
    locations: tuple[Location, ...]  # fragment i at locations[i]


class Index:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: dict[ObjectId, Manifest] = {}
        self._members: dict[tuple[int, int], set[ObjectId]] = defaultdict(set)

    def __len__(self) -> int:
        return len(self._objects)

    def get(self, object_id: ObjectId) -> Manifest | None:
        return self._objects.get(object_id)

    def contains(self, tenant: str, keys: Iterable[str]) -> list[bool]:
        objects = self._objects
        return [(tenant, key) in objects for key in keys]

    def load(self, objects: dict[ObjectId, Manifest]) -> None:
        """Publish a recovery's objects at once (the index is empty, nobody reads it yet)."""
        with self._lock:
            self._objects.update(objects)
            for object_id, manifest in objects.items():
                for location in manifest.locations:
                    self._members[(location.database, location.region)].add(object_id)

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
            for object_id in self._members.pop((database, region), set()):
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

    def _forget_members(self, object_id: ObjectId, manifest: Manifest) -> None:
        for location in manifest.locations:
            members = self._members.get((location.database, location.region))
            if members is not None:
                members.discard(object_id)
