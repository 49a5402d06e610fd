"""Goal: every card keeps the contract of adp_gateway/card/base.py, the key-value surface the
object store stores through: named values of at most the value size, in namespaces, on
databases. One suite, run on each card in the tree (the software card over database files, the
memory card), each opened the way the gateway opens it (the config's ``card`` key, through the
loader): that both pass it is what proves the seam. Each card also tells its holdings of every
name it comes to hold or lets go, evictions included: that is how the store above learns of them.

What only a persistent card promises (values and deletes survive a reopen, and a recovery
reports them) is checked on the cards that say they are persistent; a volatile card must say so,
and come back empty."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest

from adp_gateway.card.base import BuiltinCard, Card, CardContext, Value, Wanted
from adp_gateway.card.loader import card_class, open_card
from adp_gateway.card.memory import MemoryCard
from adp_gateway.card.software.card import SoftwareCard
from adp_gateway.config import GatewayConfig, TenantConfig
from adp_gateway.errors import ConfigError, StorageError
from adp_wire.checksum import checksum
from tests.support.storage import (
    CARD_CAPACITY,
    CARD_DATABASES,
    FRAGMENT,
    REGION,
    card_config,
    extent,
    payload,
)

VALUE = FRAGMENT
DATABASES, CAPACITY = CARD_DATABASES, CARD_CAPACITY


class Heard:
    """The holdings a card reports to: which names it holds, per namespace, as it says."""

    def __init__(self) -> None:
        self.held: dict[str, set[str]] = defaultdict(set)
        self.recoveries: list[str] = []

    def recovered(self, namespace: str, names: Iterable[str], /) -> None:
        self.recoveries.append(namespace)
        self.held[namespace] |= set(names)

    def added(self, namespace: str, name: str, /) -> None:
        assert name not in self.held[namespace], f"{name} added twice"
        self.held[namespace].add(name)

    def removed(self, namespace: str, name: str, /) -> None:
        self.held[namespace].remove(name)


Opener = Callable[[], tuple[Card, Heard]]


@pytest.fixture(params=list(BuiltinCard), ids=str)
def reopen(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """Opens (and recovers) the card over the same storage each time it is called, with fresh
    holdings; the card opened before is closed first. Tenant "q" has a quota."""
    quota = TenantConfig(name="q", quota=2 * DATABASES * REGION)
    config = card_config(str(request.param), tmp_path, tenants=[quota])
    opened: list[Card] = []

    def open_again() -> tuple[Card, Heard]:
        if opened:
            opened.pop().close()
        heard = Heard()
        card = open_card(config, CardContext(lambda: None, heard))
        card.recover()
        opened.append(card)
        return card, heard

    yield open_again
    for card in opened:
        card.close()


def value(name: str, data: bytes, database: int = 0, sum_: int | None = None) -> Value:
    return Value(database, name, extent(data), len(data), sum_)


def get(card: Card, name: str, size: int, namespace: str = "n") -> bytes | None:
    out = extent(bytes(size))
    return bytes(out[:size]) if card.get(namespace, [Wanted(name, out, size)])[0] else None


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


def test_every_builtin_card_states_whether_it_persists() -> None:
    assert SoftwareCard.persistent and not MemoryCard.persistent


def test_a_gateway_config_picks_the_card(tmp_path: Path) -> None:
    config = GatewayConfig(data_dirs=[str(tmp_path)], capacity=CAPACITY, region_size=REGION)
    assert config.card == "software"  # the default
    context = CardContext(lambda: None, Heard())
    card = open_card(config.model_copy(update={"card": "memory"}), context)
    assert isinstance(card, MemoryCard)
    card.close()


@pytest.mark.parametrize("size", [0, 1, 4095, VALUE - 1, VALUE])
def test_a_value_comes_back_as_it_was_put(reopen: Opener, size: int) -> None:
    card, heard = reopen()
    assert card.value_bytes == VALUE and card.databases == DATABASES
    data = payload(size, size)
    card.put("n", [value("v", data, database=1)])
    assert card.exists("n", ["v", "other"]) == [True, False]
    assert heard.held["n"] == {"v"}
    assert get(card, "v", size) == data
    assert get(card, "v", size + 1) is None  # another length is a miss, never wrong bytes
    assert card.databases_holding("n", ["v", "other"]) == {1}


def test_one_put_holds_values_on_several_databases_and_one_get_reads_them(reopen: Opener) -> None:
    card, _ = reopen()
    stored = {f"v{i}": payload(i, 5000 + i) for i in range(6)}
    card.put(
        "n", [value(name, data, i % DATABASES) for i, (name, data) in enumerate(stored.items())]
    )
    assert card.databases_holding("n", list(stored)) == set(range(DATABASES))
    names = [*stored, "absent"]
    outs = [extent(bytes(len(stored.get(name, b"x")))) for name in names]
    wanted = [Wanted(n, out, len(stored.get(n, b"x"))) for n, out in zip(names, outs, strict=True)]
    assert card.get("n", wanted) == [True] * len(stored) + [False]
    for name, out in zip(stored, outs, strict=False):
        assert bytes(out[: len(stored[name])]) == stored[name]
    assert card.get("n", []) == []


def test_a_put_of_a_held_name_replaces_it(reopen: Opener) -> None:
    card, heard = reopen()
    card.put("n", [value("v", payload(1, 9000))])
    card.put("n", [value("v", payload(2, 7000))])
    assert get(card, "v", 9000) is None
    assert get(card, "v", 7000) == payload(2, 7000)
    assert card.statistics().values == 1 and heard.held["n"] == {"v"}


def test_a_deleted_value_is_gone_and_namespaces_are_apart(reopen: Opener) -> None:
    card, heard = reopen()
    card.put("a", [value("v", payload(1, 5000))])
    card.put("b", [value("v", payload(2, 5000))])
    assert card.delete("a", ["v", "v", "absent"]) == [True, False, False]
    assert card.exists("a", ["v"]) == [False] and card.exists("b", ["v"]) == [True]
    assert get(card, "v", 5000, namespace="a") is None
    assert get(card, "v", 5000, namespace="b") == payload(2, 5000)
    assert heard.held["a"] == set() and heard.held["b"] == {"v"}
    assert card.statistics().values == 1


def test_a_value_that_fails_its_checksum_is_a_miss_and_is_dropped(reopen: Opener) -> None:
    """A zero-copy store hands the client's checksum in; bytes that do not match it (they
    changed under the write) are a miss at the first get, and the value is let go."""
    card, heard = reopen()
    data = payload(4, 10000)
    card.put(
        "n", [value("good", data, sum_=checksum(data)), value("bad", data, 1, checksum(data) ^ 1)]
    )
    assert get(card, "good", len(data)) == data
    assert get(card, "bad", len(data)) is None
    assert card.exists("n", ["bad"]) == [False] and heard.held["n"] == {"good"}
    assert card.statistics().verify_failures == 1


def test_a_full_card_evicts_within_its_capacity_and_says_what_it_let_go(reopen: Opener) -> None:
    card, heard = reopen()
    assert card.statistics().used_bytes == 0
    names = [f"v{i}" for i in range(3 * CAPACITY // VALUE)]
    for i, name in enumerate(names):
        card.put("n", [value(name, payload(i % 7, VALUE - 4096), i % DATABASES)])
        statistics = card.statistics()
        assert 0 < statistics.used_bytes <= statistics.capacity_bytes <= CAPACITY
    assert statistics.reclaims > 0
    present = card.exists("n", names)
    assert not all(present) and all(present[-4:])  # old values went, the newest stayed
    assert heard.held["n"] == {name for name, held in zip(names, present, strict=True) if held}
    assert get(card, names[-1], VALUE - 4096) == payload((len(names) - 1) % 7, VALUE - 4096)


def test_a_put_bigger_than_its_pools_space_fails_whole_and_holds_none_of_it(
    reopen: Opener,
) -> None:
    """Its values would evict one another: the card refuses the put, nothing of it held."""
    card, heard = reopen()
    count = 2 * 2 * DATABASES * REGION // VALUE + DATABASES  # twice the quota of 'q', and more
    names = [f"v{i}" for i in range(count)]
    with pytest.raises(StorageError):
        card.put("q", [value(n, payload(i, VALUE), i % DATABASES) for i, n in enumerate(names)])
    assert card.exists("q", names) == [False] * count and not heard.held["q"]


def test_a_namespace_with_a_quota_evicts_only_its_own_values(reopen: Opener) -> None:
    card, heard = reopen()
    card.put("n", [value("other", payload(1, 5000))])
    names = [f"v{i}" for i in range(24)]  # one and a half times the quota
    for i, name in enumerate(names):
        card.put("q", [value(name, payload(i, VALUE - 4096), i % DATABASES)])
        held, limit = card.pool_bytes("q")
        assert 0 < held <= limit == 2 * DATABASES * REGION
    assert card.exists("n", ["other"]) == [True]
    present = card.exists("q", names)
    assert not all(present) and present[-1]
    assert heard.held["q"] == {name for name, held in zip(names, present, strict=True) if held}


def test_a_persistent_card_recovers_its_values_and_deletes_and_reports_them(
    reopen: Opener,
) -> None:
    card, _ = reopen()
    kept = {f"v{i}": payload(i, 1000 * i + 1) for i in range(6)}
    card.put("n", [value(name, data, i % DATABASES) for i, (name, data) in enumerate(kept.items())])
    card.put("m", [value("w", payload(9, 100))])
    card.delete("n", ["v2"])
    card.sync_all()
    card, heard = reopen()
    if not type(card).persistent:
        assert card.statistics().values == 0 and card.exists("n", ["v1"]) == [False]
        assert not any(heard.held.values())
        return
    assert sorted(heard.recoveries) == ["m", "n"]  # once per namespace
    assert heard.held["n"] == set(kept) - {"v2"} and heard.held["m"] == {"w"}
    assert card.statistics().values == 6
    for name, data in kept.items():
        assert get(card, name, len(data)) == (None if name == "v2" else data)
