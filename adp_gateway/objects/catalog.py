"""Each tenant's objects and the version of each the card holds whole.

The catalog hears the card's holdings (card/holdings.py): a recovery's names, from which it puts
the objects back together (the newest version whose every fragment is on the card wins), and
every value the card lets go (a delete, an eviction, a corrupt fragment), which drops the
object it belonged to. It tells the gateway's holdings (the presence tables) of each object it
comes to hold or lets go. Lookups (``contains``) are one dict probe per key.

An object a recovery found whole in one fragment (the common case) is held by its name's suffix
and read into a ``Version`` at its first use, so that a restart does no more per object than
split its name: 100,000 objects in well under a tenth of a second.

Thread-safe; the card calls it while holding its own locks, and it never calls the card.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import defaultdict
from collections.abc import Iterable

from adp_gateway.card.holdings import Holdings
from adp_gateway.objects.names import ONLY_FRAGMENT, Version, parse, whole

log = logging.getLogger(__name__)

Entry = Version | str  # a str: a recovered object's name suffix, read into a Version when used


class ObjectCatalog:
    def __init__(self, holdings: Holdings) -> None:
        """``holdings``: who hears of the objects held (the gateway's presence tables)."""
        self._holdings = holdings
        self._lock = threading.Lock()
        self._tenants: dict[str, dict[str, Entry]] = {}
        self._count = 0
        self._numbers = itertools.count(1)
        # Names to delete: versions superseded, or never whole (a put failed, or partly evicted).
        self._stale: dict[str, list[str]] = defaultdict(list)

    def __len__(self) -> int:
        return self._count

    def get(self, tenant: str, key: str) -> Version | None:
        entry = self._tenants.get(tenant, _EMPTY).get(key)
        if not isinstance(entry, str):
            return entry
        with self._lock:
            return self._current(tenant, key)

    def contains(self, tenant: str, keys: list[str]) -> list[bool]:
        return list(map(self._tenants.get(tenant, _EMPTY).__contains__, keys))

    def next_number(self) -> int:
        with self._lock:
            return next(self._numbers)

    def publish(self, tenant: str, key: str, version: Version) -> Version | None:
        """Make ``version`` (every fragment on the card) the object's current one, unless a
        newer one is there already (two puts of one key at once); return the version no longer
        in use (the one replaced, or ``version`` itself), or None."""
        with self._lock:
            current = self._current(tenant, key)
            if current is None:
                self._count += 1
                self._holdings.added(tenant, key)
            elif current.number > version.number:
                return version
            self._tenants.setdefault(tenant, {})[key] = version
            return current

    def remove(self, tenant: str, key: str, number: int) -> bool:
        """Drop the object if version ``number`` is its current one; whether it was."""
        with self._lock:
            version = self._current(tenant, key)
            if version is None or version.number != number:
                return False
            self._drop(tenant, key)
            return True

    def take_stale(self) -> dict[str, list[str]]:
        """The names of whole versions a recovery found superseded by a newer one, per tenant:
        the store deletes them, so that they never come back once the newer one goes."""
        with self._lock:
            stale, self._stale = dict(self._stale), defaultdict(list)
            return stale

    def _current(self, tenant: str, key: str) -> Version | None:
        """Under the lock: the object's version, a recovered suffix read into one (a suffix
        that says no whole object drops the object: no store wrote it)."""
        objects = self._tenants.get(tenant, _EMPTY)
        entry = objects.get(key)
        if not isinstance(entry, str):
            return entry
        version = whole(entry)
        if version is None:
            log.warning("%s/%s: %r names no whole object; dropped", tenant, key, entry)
            self._drop(tenant, key)
        else:
            objects[key] = version
        return version

    def _drop(self, tenant: str, key: str) -> None:
        del self._tenants[tenant][key]
        self._count -= 1
        self._holdings.removed(tenant, key)

    # The card's holdings ----------------------------------------------------------------------

    def recovered(self, namespace: str, names: Iterable[str], /) -> None:
        """Written for speed: the name of an object's only fragment (the common case) is split
        and its suffix kept as it is; any other name is parsed, and its object kept once whole."""
        objects: dict[str, Entry] = {}
        split: dict[tuple[str, Version], list[str]] = defaultdict(list)  # fragments found
        top = foreign = 0
        only_fragment = ONLY_FRAGMENT.fullmatch
        for name in names:
            key, separator, suffix = name.rpartition("#")
            if separator and (found := only_fragment(suffix)) is not None:
                top = max(top, int(found[1]))
                if objects.setdefault(key, suffix) is not suffix:  # seen before: rare
                    self._offer(namespace, objects, key, suffix)
                continue
            fragment = parse(name)
            if fragment is None:
                foreign += 1
            else:
                split[(fragment.key, fragment.version)].append(name)
                top = max(top, fragment.version.number)
        for (key, version), fragments_found in split.items():
            if len(fragments_found) == version.fragments:
                self._offer(namespace, objects, key, version)
            else:  # a put that failed on another database, or a version partly evicted
                self._stale[namespace].extend(fragments_found)
        if foreign:
            log.warning(
                "tenant %r: %d values on the card are no fragment of an object (an older layout);"
                " they stay until eviction reclaims their space",
                namespace,
                foreign,
            )
        with self._lock:
            assert namespace not in self._tenants, "one recovery per namespace"
            self._tenants[namespace] = objects
            self._count += len(objects)
            self._numbers = itertools.count(max(top + 1, next(self._numbers)))
            self._holdings.recovered(namespace, objects)

    def added(self, namespace: str, name: str, /) -> None:
        pass  # an object is held once its put publishes it, every fragment on the card

    def removed(self, namespace: str, name: str, /) -> None:
        fragment = parse(name)
        if fragment is not None:
            self.remove(namespace, fragment.key, fragment.version.number)

    def _offer(self, tenant: str, objects: dict[str, Entry], key: str, entry: Entry) -> None:
        """A second whole version of ``key`` in a recovery (or the first of several fragments):
        the newest is kept, an older one's names go to be deleted."""
        held = objects.setdefault(key, entry)
        if held is entry:
            return
        ours, theirs = _version(entry), _version(held)
        if ours is not None and theirs is not None:
            objects[key] = max(ours, theirs)
            self._stale[tenant].extend(min(ours, theirs).names(key))
        elif ours is not None:  # the other's suffix says no whole object: no store wrote it
            objects[key] = ours


def _version(entry: Entry) -> Version | None:
    return whole(entry) if isinstance(entry, str) else entry


_EMPTY: dict[str, Entry] = {}
