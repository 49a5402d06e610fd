"""Each tenant's objects and the version of each the card holds whole.

The catalog hears the card's holdings (card/holdings.py): a recovery's names, from which it puts
the objects back together (the newest version whose every fragment is on the card wins), and
every value the card lets go (a delete, an eviction, a corrupt fragment), which drops the
object it belonged to. It tells the gateway's holdings (the presence tables) of each object it
comes to hold or lets go. Lookups (``contains``) are one dict probe per key.

Thread-safe; the card calls it while holding its own locks, and it never calls the card.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import defaultdict
from collections.abc import Iterable

from adp_gateway.card.holdings import Holdings
from adp_gateway.objects.names import NAME, Version, parse, well_formed

log = logging.getLogger(__name__)


class Catalog:
    def __init__(self, holdings: Holdings) -> None:
        """``holdings``: who hears of the objects held (the gateway's presence tables)."""
        self._holdings = holdings
        self._lock = threading.Lock()
        self._tenants: dict[str, dict[str, Version]] = {}
        self._count = 0
        self._numbers = itertools.count(1)
        self._stale: dict[str, list[str]] = defaultdict(list)  # whole, superseded: to delete

    def __len__(self) -> int:
        return self._count

    def get(self, tenant: str, key: str) -> Version | None:
        return self._tenants.get(tenant, _EMPTY).get(key)

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
            objects = self._tenants.setdefault(tenant, {})
            current = objects.get(key)
            if current is None:
                self._count += 1
                self._holdings.added(tenant, key)
            elif current.number > version.number:
                return version
            objects[key] = version
            return current

    def remove(self, tenant: str, key: str, number: int) -> bool:
        """Drop the object if version ``number`` is its current one; whether it was."""
        with self._lock:
            objects = self._tenants.get(tenant, _EMPTY)
            version = objects.get(key)
            if version is None or version.number != number:
                return False
            del objects[key]
            self._count -= 1
            self._holdings.removed(tenant, key)
            return True

    def take_stale(self) -> dict[str, list[str]]:
        """The names of whole versions a recovery found superseded by a newer one, per tenant:
        the store deletes them, so that they never come back once the newer one goes."""
        with self._lock:
            stale, self._stale = dict(self._stale), defaultdict(list)
            return stale

    # The card's holdings ----------------------------------------------------------------------

    def recovered(self, namespace: str, names: Iterable[str], /) -> None:
        """Written for speed (100,000 objects in a fraction of a second): one regular
        expression match per name, and a name of an object of one fragment (the common case)
        is its whole version at once."""
        objects: dict[str, Version] = {}
        stale = self._stale[namespace]
        split: dict[tuple[str, Version], int] = defaultdict(int)  # fragments found of each
        top = foreign = 0
        match, new = NAME.fullmatch, tuple.__new__  # what a NamedTuple's constructor calls
        for name in names:
            found = match(name)
            if found is None:
                foreign += 1
                continue
            key, number, place, fragments, fragment_bytes, object_bytes = found.groups()
            version = new(
                Version, (int(number), int(object_bytes), int(fragment_bytes), int(fragments))
            )
            top = version.number if version.number > top else top
            if not well_formed(version, int(place)):
                foreign += 1
            elif version.fragments > 1:
                split[(key, version)] += 1
            elif objects.setdefault(key, version) is not version:  # seen before: rare
                _offer(objects, stale, key, version)
        for (key, version), fragments_found in split.items():
            if fragments_found == version.fragments:  # else a put that did not finish, or a
                _offer(objects, stale, key, version)  # version partly evicted
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


_EMPTY: dict[str, Version] = {}


def _offer(objects: dict[str, Version], stale: list[str], key: str, version: Version) -> None:
    """A whole version of ``key``: the newest is kept, an older one's names go to ``stale``."""
    current = objects.setdefault(key, version)
    if current is not version:
        objects[key] = max(current, version)
        stale.extend(min(current, version).names(key))
