"""Goal: the object layer puts objects back together from the card's values alone. Each
fragment's name says which object, version and place it is (objects/names.py); a recovery keeps
the newest version whose every fragment is on the card, deletes a whole older one for good, and
ignores values that are no fragment's; new versions are numbered above every one it found."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pytest

from adp_gateway.card.base import Value
from adp_gateway.card.memory import MemoryCard
from adp_gateway.card.software.devices.faulty import FaultyDevice
from adp_gateway.card.software.devices.memory import MemoryDevice
from adp_gateway.errors import StorageError
from adp_gateway.objects.catalog import ObjectCatalog
from adp_gateway.objects.names import FragmentId, Version, fragment_name, parse
from adp_gateway.objects.store import ObjectStore
from tests.support.storage import FRAGMENT, REGION, extent, open_card, open_store, payload

VALUE = 64 * 2**10


class Heard:
    def __init__(self) -> None:
        self.held: dict[str, set[str]] = {}

    def recovered(self, namespace: str, names: Iterable[str], /) -> None:
        self.held[namespace] = set(names)

    def added(self, namespace: str, name: str, /) -> None:
        self.held.setdefault(namespace, set()).add(name)

    def removed(self, namespace: str, name: str, /) -> None:
        self.held[namespace].discard(name)


@pytest.mark.parametrize("key", ["k", "", "a#b", "x#1.0.1.4096.10", "ünïcode", "k.0.1"])
def test_a_fragment_name_says_its_object_version_and_place(key: str) -> None:
    version = Version(7, 3 * VALUE + 5, VALUE, 4)
    for place in range(4):
        assert parse(fragment_name(key, version, place)) == FragmentId(key, version, place)
    assert version.span(3) == (3 * VALUE, 5)
    assert version.names(key) == [fragment_name(key, version, p) for p in range(4)]


@pytest.mark.parametrize(
    "name",
    [
        "plain-lmcache-key",  # a value of the layout before fragment names
        "k#1.0.1.4096",  # a field missing
        "k#1.1.1.4096.10",  # place beyond the fragments
        "k#1.0.2.4096.10",  # two fragments cannot hold 10 bytes of 4 KiB fragments
        "k#1.0.1.0.10",  # no fragment size
        "k#-1.0.1.4096.10",
        "k#1.0.1.4096.\u0661\u0660",  # digits, but not ASCII ones
        "",
    ],
)
def test_a_name_that_is_no_fragment_is_not_taken_for_one(name: str) -> None:
    assert parse(name) is None


def test_a_recovery_keeps_the_newest_whole_version_and_gives_up_the_rest() -> None:
    heard = Heard()
    catalog = ObjectCatalog(heard)
    old, new, partial = (
        Version(3, 10, VALUE, 1),
        Version(5, 20, VALUE, 1),
        Version(9, 2 * VALUE, VALUE, 2),
    )
    names = [
        *old.names("k"),
        *new.names("k"),
        fragment_name("k", partial, 0),  # a newer version missing a fragment: not whole
        *Version(4, 30, VALUE, 1).names("other"),
        "older-layout-value",
        "odd#6.0.1.0.10",  # the shape of a fragment's name, but no fragment size: no store's
    ]
    catalog.recovered("t", names)
    assert catalog.get("t", "k") == new and catalog.get("t", "other") is not None
    assert catalog.get("t", "odd") is None  # read at its first use, and dropped
    assert len(catalog) == 2 and heard.held["t"] == {"k", "other"}
    # Superseded, or never whole: to be deleted.
    assert catalog.take_stale() == {"t": [*old.names("k"), fragment_name("k", partial, 0)]}
    assert catalog.next_number() == 10  # above every version found, whole or not


def test_a_store_deletes_a_superseded_whole_version_at_recovery() -> None:
    """Two whole versions of one object on the card (an overwrite whose delete a power cut lost):
    the newer wins, and the older is deleted for good, so it cannot come back once the newer
    goes."""
    device = MemoryDevice(4096 + 8 * REGION)
    card = open_card([device])
    card.recover()
    older, newer = Version(1, 100, VALUE, 1), Version(2, 200, VALUE, 1)
    card.put("t", [Value(0, older.names("k")[0], extent(payload(1, 100)), 100)])
    card.put("t", [Value(0, newer.names("k")[0], extent(payload(2, 200)), 200)])
    card.close()
    store = open_store([device])
    out = extent(bytes(200))
    assert store.get("t", "k", out, 200) and bytes(out[:200]) == payload(2, 200)
    assert store.card.exists("t", older.names("k")) == [False]
    assert store.delete("t", ["k"]) == [True]
    store.close()
    assert open_store([device]).exists("t", ["k"]) == [False]  # the older did not come back


def test_of_two_puts_of_one_key_at_once_the_newer_version_stays_and_the_other_goes() -> None:
    """Both puts found the key absent and wrote their version; the first to start publishes
    last. The catalog keeps the newer version, and the older one's fragments leave the card."""
    racing: list[Callable[[], None]] = []

    class RacingCard(MemoryCard):
        def put(self, namespace: str, values: list[Value]) -> None:
            super().put(namespace, values)
            while racing:
                racing.pop()()  # the other put runs start to end inside this one

    catalog = ObjectCatalog(Heard())
    card = RacingCard(1, 2**20, VALUE, holdings=catalog)
    store = ObjectStore(card, catalog)
    racing.append(lambda: store.put("t", "k", extent(payload(2, 100)), 100))
    store.put("t", "k", extent(payload(1, 100)), 100)
    version = store.version("t", "k")
    assert version is not None and version.number == 2
    assert card.statistics().values == 1  # version 1's fragment left the card
    out = extent(bytes(100))
    assert store.get("t", "k", out, 100) and bytes(out[:100]) == payload(2, 100)


def test_the_fragments_a_failed_put_left_on_another_database_go_at_recovery() -> None:
    """A two-fragment put whose write to one database fails: the other's fragment is on its
    disk, part of no object. A restart deletes it, so the card holds nothing of the put."""
    memory = [MemoryDevice(4096 + 8 * REGION) for _ in range(2)]
    devices = [FaultyDevice(m) for m in memory]
    store = open_store(list(devices))
    size = 2 * FRAGMENT
    failing = store.fragment_plan("t", "k", size)[1].database
    devices[failing].fail("write", count=100)
    with pytest.raises(StorageError):
        store.put("t", "k", extent(payload(1, size)), size)
    devices[failing].clear()
    store.close()
    store = open_store(list(memory))
    assert store.card.statistics().values == 0
    store.close()
