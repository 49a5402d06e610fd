"""Goal: every card keeps the contract of adp_gateway/card/base.py, the one interface the gateway
stores through. One suite, run on each card in the tree (the software card over database files,
the memory card), each opened the way the gateway opens it (the config's ``card`` key, through
the loader): that both pass it is what proves the seam. Each card also reports every key it
comes to hold or lets go (``CardContext.holdings``), so a presence table fed by it answers as
``exists`` does.

What only a persistent card promises (values and deletes survive a reopen) is checked on the
cards that say they are persistent; a volatile card must say so, and come back empty."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from adp_gateway.card.base import BuiltinCard, Card, CardContext
from adp_gateway.card.loader import card_class, open_card
from adp_gateway.card.memory import MemoryCard
from adp_gateway.card.software.card import SoftwareCard
from adp_gateway.config import GatewayConfig
from adp_gateway.errors import ConfigError
from adp_gateway.presence import Presence
from adp_wire.checksum import checksum
from adp_wire.presence import PresenceView
from tests.support.storage import extent, payload

REGION = 256 * 2**10
FRAGMENT = 64 * 2**10
DATABASES = 2
CAPACITY = DATABASES * (4096 + 8 * REGION)  # 8 regions per database
OBJECT = 48 * 2**10  # one fragment, a record well inside a region

Opener = Callable[[], Card]


@pytest.fixture
def presence() -> Iterator[Presence]:
    tables = Presence()
    yield tables
    tables.close()


@pytest.fixture(params=list(BuiltinCard), ids=str)
def reopen(request: pytest.FixtureRequest, tmp_path: Path, presence: Presence) -> Iterator[Opener]:
    """Opens (and recovers) the card over the same storage each time it is called; the card
    opened before is closed first, and ``presence`` forgets every key, as a restart would."""
    config = GatewayConfig(
        card=str(request.param),
        data_dirs=[str(tmp_path)],
        databases_per_dir=DATABASES,
        capacity=CAPACITY,
        region_size=REGION,
        fragment_size=FRAGMENT,
        prepare_databases=False,
        sync="always",
    )
    opened: list[Card] = []

    def open_again() -> Card:
        if opened:
            opened.pop().close()
        presence.close()
        card = open_card(config, CardContext(lambda: None, lambda _d, _p, device: device, presence))
        card.recover()
        opened.append(card)
        return card

    yield open_again
    for card in opened:
        card.close()


def put(card: Card, key: str, data: bytes, tenant: str = "t") -> None:
    card.put(tenant, key, extent(data), len(data))


def get(card: Card, key: str, size: int, tenant: str = "t") -> bytes | None:
    out = extent(bytes(size))
    return bytes(out[:size]) if card.get(tenant, key, out, size) else None


def assert_presence_agrees(
    card: Card, presence: Presence, keys: list[str], tenant: str = "t"
) -> None:
    """The tenant's presence table, read as the plugin reads it, answers as ``exists`` does."""
    fd, slots = presence.share(tenant)
    try:
        view = PresenceView(fd, slots)
    finally:
        os.close(fd)
    assert view.find(keys) == card.exists(tenant, keys)


def test_the_loader_gives_each_builtin_card_its_class() -> None:
    assert card_class("software") is SoftwareCard
    assert card_class("memory") is MemoryCard
    assert card_class("adp_gateway.card.memory:MemoryCard") is MemoryCard  # a module path


@pytest.mark.parametrize(
    "name",
    ["sofware", "", "adp_gateway.card.memory:NoSuchCard", "no_such_module:Card", "math:pi"],
)
def test_a_bad_card_name_is_refused_naming_it_and_the_choices(name: str) -> None:
    with pytest.raises(ConfigError) as refused:
        card_class(name)
    assert repr(name) in str(refused.value)
    assert "'software', 'memory', or 'package.module:Class'" in str(refused.value)


@pytest.mark.parametrize("size", [0, 1, 4095, FRAGMENT - 1, FRAGMENT, 3 * FRAGMENT + 5])
def test_a_value_comes_back_as_it_was_put(reopen: Opener, size: int) -> None:
    card = reopen()
    data = payload(size, size)
    put(card, "k", data)
    assert card.exists("t", ["k", "other"]) == [True, False]
    assert get(card, "k", size) == data
    assert get(card, "k", size + 1) is None  # another length is a miss, never wrong bytes


def test_several_values_come_back_together_each_with_its_own_answer(reopen: Opener) -> None:
    """get_many, the session's path for a doorbell's small loads: values stored one after
    another (back to back on a log), one striped over both databases, a missing key and a
    wrong length in one call; each answer and each extent as its own get would give."""
    card = reopen()
    sizes = {"a": OBJECT, "b": 1, "c": 3 * FRAGMENT + 5, "d": OBJECT}
    stored = {key: payload(i + 7, size) for i, (key, size) in enumerate(sizes.items())}
    for key, data in stored.items():
        put(card, key, data)
    wanted = [("d", OBJECT), ("absent", OBJECT), ("a", OBJECT), ("c", sizes["c"]), ("b", 2)]
    wanted += [("b", 1)]
    extents = [extent(bytes(size)) for _, size in wanted]
    found = card.get_many("t", [(k, e, n) for (k, n), e in zip(wanted, extents, strict=True)])
    assert found == [True, False, True, True, False, True]
    for (key, size), out, hit in zip(wanted, extents, found, strict=True):
        if hit:
            assert bytes(out[:size]) == stored[key]
    assert card.get_many("t", []) == []


def test_a_value_is_stored_as_fragments_no_larger_than_the_value_size(reopen: Opener) -> None:
    card = reopen()
    assert card.fragment_bytes == FRAGMENT and card.databases == DATABASES
    size = 5 * FRAGMENT + 1
    plan = card.fragment_plan("t", "k", size)
    assert len(plan) == card.fragment_count(size) == 6
    assert all(0 < fragment.length <= FRAGMENT for fragment in plan)
    assert sum(fragment.length for fragment in plan) == size
    assert card.databases_to_store("t", "k", size) == set(range(DATABASES))  # striped
    put(card, "k", payload(3, size))
    assert card.databases_holding("t", ["k", "absent"]) == set(range(DATABASES))
    assert card.databases_holding("t", ["absent"]) == frozenset()


def test_misses_are_misses(reopen: Opener) -> None:
    card = reopen()
    assert get(card, "absent", 100) is None
    assert card.exists("t", ["absent"]) == [False]
    assert card.delete("t", ["absent"]) == [False]
    statistics = card.statistics()
    assert (statistics.loads, statistics.load_misses) == (1, 1)


def test_a_deleted_value_is_gone(reopen: Opener, presence: Presence) -> None:
    card = reopen()
    put(card, "a", payload(1, 5000))
    put(card, "b", payload(2, 5000))
    assert_presence_agrees(card, presence, ["a", "b", "c"])
    assert card.delete("t", ["a", "a", "c"]) == [True, False, False]
    assert card.exists("t", ["a", "b"]) == [False, True]
    assert_presence_agrees(card, presence, ["a", "b", "c"])
    assert get(card, "a", 5000) is None
    assert card.statistics().objects == 1


def test_a_put_of_the_same_length_keeps_the_value_another_length_replaces_it(
    reopen: Opener, presence: Presence
) -> None:
    """Keys name content: a second put of the same length is skipped (the bytes are the same);
    another length is a new version, and the old one never comes back."""
    card = reopen()
    first, second = payload(1, 9000), payload(2, 9000)
    put(card, "k", first)
    put(card, "k", second)
    assert get(card, "k", 9000) == first
    assert card.statistics().stores_skipped == 1
    longer = payload(3, 3 * FRAGMENT)
    put(card, "k", longer)
    assert get(card, "k", 9000) is None
    assert get(card, "k", len(longer)) == longer
    assert card.statistics().objects == 1
    assert_presence_agrees(card, presence, ["k"])


def test_tenants_are_namespaces(reopen: Opener, presence: Presence) -> None:
    card = reopen()
    mine, theirs = payload(1, 7000), payload(2, 7000)
    put(card, "k", mine, tenant="a")
    put(card, "k", theirs, tenant="b")
    assert card.delete("a", ["k"]) == [True]
    assert card.exists("b", ["k"]) == [True]
    assert_presence_agrees(card, presence, ["k"], tenant="a")
    assert_presence_agrees(card, presence, ["k"], tenant="b")
    assert get(card, "k", 7000, tenant="b") == theirs


def test_zero_copy_checksums_are_kept_and_a_wrong_one_is_a_miss(
    reopen: Opener, presence: Presence
) -> None:
    """A zero-copy store hands the client's checksums in, and a load verifies the bytes against
    them. A store whose bytes changed under the write (its checksum does not match) is dropped at
    its first load."""
    card = reopen()
    data = payload(4, 2 * FRAGMENT + 10)
    sums = [
        checksum(memoryview(data)[f.offset : f.offset + f.length])
        for f in card.fragment_plan("t", "k", len(data))
    ]
    card.put("t", "k", extent(data), len(data), sums)
    assert get(card, "k", len(data)) == data
    card.put("t", "bad", extent(data), len(data), [sums[0] ^ 1, *sums[1:]])
    assert get(card, "bad", len(data)) is None
    assert card.exists("t", ["bad"]) == [False]
    assert card.statistics().verify_failures == 1
    assert_presence_agrees(card, presence, ["k", "bad"])


def test_a_full_card_evicts_and_stays_within_its_capacity(
    reopen: Opener, presence: Presence
) -> None:
    card = reopen()
    assert card.statistics().used_bytes == 0
    written = {}
    for i in range(3 * CAPACITY // OBJECT):
        written[f"k{i}"] = payload(i % 11, OBJECT)
        put(card, f"k{i}", written[f"k{i}"])
        statistics = card.statistics()
        assert 0 < statistics.used_bytes <= statistics.capacity_bytes <= CAPACITY
    assert statistics.reclaims > 0
    keys = list(written)
    present = card.exists("t", keys)
    assert not all(present) and all(present[-4:])  # old values went, the newest stayed
    assert_presence_agrees(card, presence, keys)
    for key in keys[-4:]:
        assert get(card, key, OBJECT) == written[key]


def test_a_tenant_pool_holds_what_its_values_use(reopen: Opener) -> None:
    card = reopen()
    assert card.pool_bytes("t")[0] == 0
    put(card, "k", payload(1, OBJECT))
    held, limit = card.pool_bytes("t")
    assert 0 < held <= limit <= CAPACITY


def test_a_persistent_card_keeps_its_values_and_deletes_across_a_reopen(
    reopen: Opener, presence: Presence
) -> None:
    card = reopen()
    kept = {f"k{i}": payload(i, 1000 * i + 1) for i in range(6)}
    for key, data in kept.items():
        put(card, key, data)
    card.delete("t", ["k2"])
    card.sync_all()
    card = reopen()
    assert_presence_agrees(card, presence, list(kept))
    if not type(card).persistent:
        assert card.statistics().objects == 0 and card.exists("t", ["k1"]) == [False]
        return
    assert card.statistics().objects == 5
    assert card.exists("t", list(kept)) == [key != "k2" for key in kept]
    for key, data in kept.items():
        assert get(card, key, len(data)) == (None if key == "k2" else data)


def test_every_builtin_card_states_whether_it_persists() -> None:
    assert SoftwareCard.persistent and not MemoryCard.persistent


def test_a_gateway_config_picks_the_card(tmp_path: Path) -> None:
    config = GatewayConfig(data_dirs=[str(tmp_path)], capacity=CAPACITY, region_size=REGION)
    assert config.card == "software"  # the default
    context = CardContext(lambda: None, lambda _d, _p, device: device, Presence())
    card = open_card(config.model_copy(update={"card": "memory"}), context)
    assert isinstance(card, MemoryCard)
    card.close()
