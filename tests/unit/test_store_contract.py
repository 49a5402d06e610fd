"""Goal: the object store keeps its contract (adp_gateway/objects/store.py: what the gateway's
sessions store through) over every card in the tree (the software card over database files, the
memory card), each opened the way the gateway opens it (the config's ``card`` key, through the
loader). Objects are split into fragments, each a value of the card; the store reports every key
it comes to hold or lets go, so a presence table fed by it answers as ``exists`` does, evictions
by the card included.

What only a persistent card promises (objects and deletes survive a reopen) is checked on the
cards that say they are persistent; a volatile card must say so, and come back empty."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from adp_gateway.card.base import BuiltinCard, CardContext
from adp_gateway.errors import StorageError, StoreGivenUp
from adp_gateway.objects.store import ObjectStore, open_store
from adp_gateway.sessions.client_l1 import L1Segment
from adp_gateway.sessions.extents import L1Object
from adp_gateway.sessions.presence import Presence
from adp_wire.presence import PresenceView
from adp_wire.ring.layout import PAGE_BYTES, align_up
from tests.support.storage import (
    CARD_CAPACITY,
    CARD_DATABASES,
    FRAGMENT,
    card_config,
    extent,
    payload,
)

DATABASES, CAPACITY = CARD_DATABASES, CARD_CAPACITY
OBJECT = 48 * 2**10  # one fragment, a record well inside a region

Opener = Callable[[], ObjectStore]


@pytest.fixture
def presence() -> Iterator[Presence]:
    tables = Presence()
    yield tables
    tables.close()


@pytest.fixture(params=list(BuiltinCard), ids=str)
def reopen(request: pytest.FixtureRequest, tmp_path: Path, presence: Presence) -> Iterator[Opener]:
    """Opens (and recovers) a store over the card, on the same storage each time it is called;
    the store opened before is closed first, and ``presence`` forgets every key, as a restart
    would."""
    config = card_config(str(request.param), tmp_path)
    opened: list[ObjectStore] = []

    def open_again() -> ObjectStore:
        if opened:
            opened.pop().close()
        presence.close()
        context = CardContext(lambda: None, presence)
        store = open_store(config, context)
        store.recover()
        opened.append(store)
        return store

    yield open_again
    for store in opened:
        store.close()


def put(store: ObjectStore, key: str, data: bytes, tenant: str = "t") -> None:
    store.put(tenant, key, extent(data), len(data))


def get(store: ObjectStore, key: str, size: int, tenant: str = "t") -> bytes | None:
    out = extent(bytes(size))
    return bytes(out[:size]) if store.get(tenant, key, out, size) else None


def assert_presence_agrees(
    store: ObjectStore, presence: Presence, keys: list[str], tenant: str = "t"
) -> None:
    """The tenant's presence table, read as the plugin reads it, answers as ``exists`` does."""
    fd, slots = presence.share(tenant)
    try:
        view = PresenceView(fd, slots)
    finally:
        os.close(fd)
    assert view.find(keys) == store.exists(tenant, keys)


@pytest.mark.parametrize("size", [0, 1, 4095, FRAGMENT - 1, FRAGMENT, 3 * FRAGMENT + 5])
def test_a_value_comes_back_as_it_was_put(reopen: Opener, size: int) -> None:
    store = reopen()
    data = payload(size, size)
    put(store, "k", data)
    assert store.exists("t", ["k", "other"]) == [True, False]
    assert get(store, "k", size) == data
    assert get(store, "k", size + 1) is None  # another length is a miss, never wrong bytes


def test_several_values_come_back_together_each_with_its_own_answer(reopen: Opener) -> None:
    """get_many, the session's path for a doorbell's small loads: values stored one after
    another (back to back on a log), one striped over both databases, a missing key and a
    wrong length in one call; each answer and each extent as its own get would give."""
    store = reopen()
    sizes = {"a": OBJECT, "b": 1, "c": 3 * FRAGMENT + 5, "d": OBJECT}
    stored = {key: payload(i + 7, size) for i, (key, size) in enumerate(sizes.items())}
    for key, data in stored.items():
        put(store, key, data)
    wanted = [("d", OBJECT), ("absent", OBJECT), ("a", OBJECT), ("c", sizes["c"]), ("b", 2)]
    wanted += [("b", 1)]
    extents = [extent(bytes(size)) for _, size in wanted]
    found = store.get_many("t", [(k, e, n) for (k, n), e in zip(wanted, extents, strict=True)])
    assert found == [True, False, True, True, False, True]
    for (key, size), out, hit in zip(wanted, extents, found, strict=True):
        if hit:
            assert bytes(out[:size]) == stored[key]
    assert store.get_many("t", []) == []


def test_a_value_is_stored_as_fragments_no_larger_than_the_value_size(reopen: Opener) -> None:
    store = reopen()
    assert store.fragment_bytes == FRAGMENT and store.databases == DATABASES
    size = 5 * FRAGMENT + 1
    plan = store.fragment_plan("t", "k", size)
    assert len(plan) == 6
    assert all(0 < fragment.length <= FRAGMENT for fragment in plan)
    assert sum(fragment.length for fragment in plan) == size
    assert store.databases_to_store("t", "k", size) == set(range(DATABASES))  # striped
    put(store, "k", payload(3, size))
    assert store.databases_holding("t", ["k", "absent"]) == set(range(DATABASES))
    assert store.databases_holding("t", ["absent"]) == frozenset()


def test_misses_are_misses(reopen: Opener) -> None:
    store = reopen()
    assert get(store, "absent", 100) is None
    assert store.exists("t", ["absent"]) == [False]
    assert store.delete("t", ["absent"]) == [False]
    statistics = store.statistics()
    assert (statistics.loads, statistics.load_misses) == (1, 1)


def test_a_deleted_value_is_gone(reopen: Opener, presence: Presence) -> None:
    store = reopen()
    put(store, "a", payload(1, 5000))
    put(store, "b", payload(2, 5000))
    assert_presence_agrees(store, presence, ["a", "b", "c"])
    assert store.delete("t", ["a", "a", "c"]) == [True, False, False]
    assert store.exists("t", ["a", "b"]) == [False, True]
    assert_presence_agrees(store, presence, ["a", "b", "c"])
    assert get(store, "a", 5000) is None
    assert store.statistics().objects == 1


def test_a_put_of_the_same_length_keeps_the_value_another_length_replaces_it(
    reopen: Opener, presence: Presence
) -> None:
    """Keys name content: a second put of the same length is skipped (the bytes are the same);
    another length is a new version, and the old one never comes back."""
    store = reopen()
    first, second = payload(1, 9000), payload(2, 9000)
    put(store, "k", first)
    put(store, "k", second)
    assert get(store, "k", 9000) == first
    assert store.statistics().stores_skipped == 1
    longer = payload(3, 3 * FRAGMENT)
    put(store, "k", longer)
    assert get(store, "k", 9000) is None
    assert get(store, "k", len(longer)) == longer
    assert store.statistics().objects == 1
    assert_presence_agrees(store, presence, ["k"])


def test_tenants_are_namespaces(reopen: Opener, presence: Presence) -> None:
    store = reopen()
    mine, theirs = payload(1, 7000), payload(2, 7000)
    put(store, "k", mine, tenant="a")
    put(store, "k", theirs, tenant="b")
    assert store.delete("a", ["k"]) == [True]
    assert store.exists("b", ["k"]) == [True]
    assert_presence_agrees(store, presence, ["k"], tenant="a")
    assert_presence_agrees(store, presence, ["k"], tenant="b")
    assert get(store, "k", 7000, tenant="b") == theirs


class L1:
    """A client's L1 segment: a shared-memory file the gateway maps read-only (L1Segment)."""

    def __init__(self, data: bytes) -> None:
        self.fd = os.memfd_create("l1")
        size = align_up(len(data)) + PAGE_BYTES  # and a page of another object's bytes
        os.ftruncate(self.fd, size)
        os.pwrite(self.fd, data + b"\xee" * (size - len(data)), 0)
        self.segment = L1Segment(self.fd, size)

    def store(self, asked: Callable[[], bool]) -> L1Object:
        return L1Object(self.segment, 0, asked)

    def close(self) -> None:
        self.segment.close()
        os.close(self.fd)


def test_a_zero_copy_store_takes_its_checksums_from_l1_before_asking_if_it_was_given_up(
    reopen: Opener, presence: Presence
) -> None:
    """A zero-copy store's checksums are taken from the client's L1 before the store asks
    whether the client gave it up: bytes rewritten after that answer (LMCache reusing a buffer
    once the plugin reported the store failed) can only fail those checksums, so the object is
    a miss, never the rewritten bytes; a store given up is not written at all, one given up
    while it was written is deleted unpublished; and L1 is never padded or written."""
    store = reopen()
    data = payload(4, 2 * FRAGMENT + 10)
    l1 = L1(data)
    before = os.pread(l1.fd, 2 * len(data), 0)
    store.put("t", "k", l1.segment.pages(0, len(data)), len(data), l1.store(lambda: False))
    assert get(store, "k", len(data)) == data
    assert os.pread(l1.fd, 2 * len(data), 0) == before

    def rewritten_after_the_answer() -> bool:
        os.pwrite(l1.fd, payload(5, len(data)), 0)
        return False

    pages = l1.segment.pages(0, len(data))
    store.put("t", "late", pages, len(data), l1.store(rewritten_after_the_answer))
    assert get(store, "late", len(data)) is None
    assert store.exists("t", ["late"]) == [False]
    assert store.statistics().verify_failures > 0  # a failed fragment, or all three

    used = store.statistics().used_bytes
    with pytest.raises(StoreGivenUp):
        store.put("t", "gone", pages, len(data), l1.store(lambda: True))
    assert store.exists("t", ["gone"]) == [False]
    assert store.statistics().used_bytes == used

    answers = iter([False, True])  # clear when the checksums are taken, set once it is written
    with pytest.raises(StoreGivenUp, match="while it was written"):
        store.put("t", "mid", pages, len(data), l1.store(lambda: next(answers)))
    assert store.exists("t", ["mid"]) == [False]

    os.ftruncate(l1.fd, PAGE_BYTES)  # a client that shrinks its segment: a failed store
    with pytest.raises(StorageError, match="shrank"):
        store.put("t", "shrunk", pages, len(data), l1.store(lambda: False))
    l1.close()
    keys = ["k", "late", "gone", "mid", "shrunk"]
    assert_presence_agrees(store, presence, keys)
    if store.persistent:
        assert reopen().exists("t", keys) == [True, False, False, False, False]


def test_a_full_card_evicts_and_stays_within_its_capacity(
    reopen: Opener, presence: Presence
) -> None:
    store = reopen()
    assert store.statistics().used_bytes == 0
    written = {}
    for i in range(3 * CAPACITY // OBJECT):
        written[f"k{i}"] = payload(i % 11, OBJECT)
        put(store, f"k{i}", written[f"k{i}"])
        statistics = store.statistics()
        assert 0 < statistics.used_bytes <= statistics.capacity_bytes <= CAPACITY
    assert statistics.reclaims > 0
    keys = list(written)
    present = store.exists("t", keys)
    assert not all(present) and all(present[-4:])  # old values went, the newest stayed
    assert_presence_agrees(store, presence, keys)
    for key in keys[-4:]:
        assert get(store, key, OBJECT) == written[key]


def test_a_tenant_pool_holds_what_its_values_use(reopen: Opener) -> None:
    store = reopen()
    assert store.pool_bytes("t")[0] == 0
    put(store, "k", payload(1, OBJECT))
    held, limit = store.pool_bytes("t")
    assert 0 < held <= limit <= CAPACITY


def test_a_persistent_card_keeps_its_values_and_deletes_across_a_reopen(
    reopen: Opener, presence: Presence
) -> None:
    store = reopen()
    kept = {f"k{i}": payload(i, 1000 * i + 1) for i in range(6)}
    for key, data in kept.items():
        put(store, key, data)
    store.delete("t", ["k2"])
    store.sync_all()
    store = reopen()
    assert_presence_agrees(store, presence, list(kept))
    if not store.persistent:
        assert store.statistics().objects == 0 and store.exists("t", ["k1"]) == [False]
        return
    assert store.statistics().objects == 5
    assert store.exists("t", list(kept)) == [key != "k2" for key in kept]
    for key, data in kept.items():
        assert get(store, key, len(data)) == (None if key == "k2" else data)
