"""The card seam: the card's own key-value surface, the one interface the object store above
(adp_gateway/objects/: fragment plans, object manifests and versions, tenant namespaces) stores
through. Everything below it (how values are laid out, indexed, evicted and recovered) is the
card's own business.

A card holds values: byte strings of at most ``value_bytes``, each named by a string within a
namespace (the object store uses one namespace per tenant, and names each fragment of an object
after the object, its version and the fragment's place: objects/names.py). A value is put on one
of the card's databases, its independent queues (one per drive on the software card): I/O on one
never waits for another's.

Contract, for every implementation (tests/unit/test_card_contract.py runs it on each):

=================  ===============================================================================
call               promise
=================  ===============================================================================
``put``            persists each value's ``payload[:length]`` on its database; afterwards
                   ``exists`` is True and ``get`` returns those bytes, until a ``delete``, another
                   put of that name or an eviction. A put of a held name replaces it, and the old
                   value never comes back. Raises ``StorageError`` when the card failed; no value
                   of the call is then held.
``get``            per value, True only when every byte read into ``into`` was verified; else a
                   miss (False), never wrong bytes. A corrupt value is dropped.
``delete``         per name, whether it was held; a deleted value never comes back, even after a
                   restart. Raises ``StorageError`` (nothing deleted) when it cannot be recorded.
``exists``         answered from memory, never from the device.
``holdings``       the card tells ``CardContext.holdings`` of every name it comes to hold (a put
                   of a new name, recovery) and every name it lets go (a delete, an eviction, a
                   value found corrupt): that is how the object store learns of evictions.
``recover``        call once, before anything else: rebuilds what a persistent card held (a
                   volatile card starts empty), reports it to ``holdings`` (``recovered``, per
                   namespace) and returns how many values it found.
``sync_all``       every write so far is durable (a no-op on a volatile card).
``syncs``          syncs that together do what ``sync_all`` does, each on its own part of the card
                   (the software card: one per database), so that the periodic clock runs each
                   on a thread of its own and a device that does not answer holds only its own.
``close``          durable and closed; the card is not used again.
``database_states``  how each database is doing, for ``adp-gateway status`` and the metrics.
``check``          (a class method, with no card open) what the card keeps on its devices is
                   walked and verified, damage reported by value and by place; ``fix`` repairs
                   what can be repaired. ``adp-gateway check`` runs it.
``format``         (a class method) empties the card's databases for a new start, refusing any
                   that holds values unless ``force``. ``adp-gateway format`` runs it.
=================  ===============================================================================

What a card reads of the gateway's settings is ``CardConfig``: its own settings as the gateway
validated them (adp_gateway/config.py satisfies it; a card may ask for more of its own).

Capacity: ``used_bytes <= capacity_bytes`` always; a full card evicts (in its own order) to make
room, so a ``put`` never fails for want of space. A namespace with a quota (the config's tenants'
``quota``) evicts only its own values; ``pool_bytes`` says what it holds. A card may say how
long values lately lasted before it evicted them (``eviction_age_s``; the default says nothing),
which the gateway's admission weighs (adp_gateway/policy/admission.py).

Buffers: ``payload`` and ``into`` are page aligned and padded to 4 KiB; the card only reads a
payload during ``put`` and writes ``into`` during ``get``, and keeps no reference after the call.

Thread-safety: every call may run concurrently from the gateway's I/O threads, except
``recover`` (before the first) and ``close`` (after the last).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar, NamedTuple, Protocol, runtime_checkable

from adp_gateway.card.holdings import Holdings

__all__ = [
    "BuiltinCard",
    "Card",
    "CardConfig",
    "CardContext",
    "CardReport",
    "CardStatistics",
    "Holdings",
    "Value",
    "ValueObserver",
    "Wanted",
]


class Value(NamedTuple):
    """A value to put: ``payload[:length]``, named ``name``, on ``database``. ``checksum``: the
    xxh3_64 of those bytes when the client computed it (a zero-copy store: ``payload`` is then
    the client's memory, which the card must not pad or modify, and a value whose bytes changed
    under the write fails its first ``get``); None, and the card computes it."""

    database: int
    name: str
    payload: memoryview
    length: int
    checksum: int | None = None


class Wanted(NamedTuple):
    """A value to get: ``name``, expected ``length`` bytes long, read into ``into``."""

    name: str
    into: memoryview
    length: int


class BuiltinCard(StrEnum):
    """The cards in the tree, by the name the config's ``card`` key gives them."""

    SOFTWARE = "software"  # the region log over files or block devices (card/software/)
    MEMORY = "memory"  # a dict in memory: volatile, for tests and as the seam's second witness


@dataclass(frozen=True)
class CardStatistics:
    values: int
    used_bytes: int
    capacity_bytes: int
    verify_failures: int
    reclaims: int  # evictions of a region (software card) or a value (memory card)
    tombstones: int


@runtime_checkable
class CardConfig(Protocol):
    """The settings every card is opened with."""

    @property
    def card(self) -> str:
        """The card the config names (card/loader.py)."""

    @property
    def capacity(self) -> int | None:
        """Bytes of the device the card may use in all (resolved before ``open``)."""

    @property
    def fragment_size(self) -> int:
        """The value size: the largest value the object store puts."""

    @property
    def sync(self) -> str:
        """When a put is durable: ``always``, ``periodic`` or ``none`` (configs/gateway.yaml)."""

    @property
    def database_paths(self) -> list[str]:
        """One per database the card keeps (files or block devices)."""

    @property
    def quotas(self) -> dict[str, int]:
        """Namespace -> the most bytes its values may hold, for namespaces with a quota."""


@dataclass(frozen=True)
class CardContext:
    """What the object store hands a card it opens.

    ``on_written``: a put calls it from its thread once its writes have landed, before it waits
    for a sync (the scheduler then lets the next store's writes go). ``holdings``: hears of the
    names the card holds (card/holdings.py)."""

    on_written: Callable[[], None]
    holdings: Holdings


@dataclass(frozen=True)
class CardReport:
    """What a maintenance call (``check``, ``format``) has to say: its lines, in order, the
    summary line after them, and whether it failed (damage left in place, a database
    refused)."""

    lines: list[str]
    summary: str
    failed: bool


class ValueObserver(Protocol):
    """The layer above a card, told by ``check`` of each value it finds verified (``seen``)
    and asked how to name a value to an operator (``named``: the object layer knows what a
    value's name means)."""

    def seen(self, namespace: str, name: str) -> None: ...

    def named(self, namespace: str, name: str) -> str: ...


class Card(abc.ABC):
    """A key-value card of named values in namespaces, on databases."""

    persistent: ClassVar[bool]  # whether values survive a close and reopen (``recover``)

    @classmethod
    @abc.abstractmethod
    def open(cls, config: CardConfig, context: CardContext) -> Card:
        """The card ``config`` describes (its databases, capacity, value size, quotas; a card
        may read settings of its own from it, checking they are there); not yet recovered.
        Raises StartupError or ConfigError with a hint."""

    @classmethod
    def check(cls, config: CardConfig, fix: bool, values: ValueObserver) -> CardReport:
        """Walk and verify what the card keeps, while no gateway serves it; ``fix`` repairs
        what can be repaired. A card that keeps nothing on a device has nothing to check."""
        return CardReport([], f"card {config.card!r} keeps nothing on a device to check", False)

    @classmethod
    def format(cls, config: CardConfig, force: bool) -> CardReport:
        """Empty the card's databases for a new start; one that holds values only if ``force``."""
        return CardReport([], f"card {config.card!r} keeps nothing on a device to format", False)

    @property
    @abc.abstractmethod
    def databases(self) -> int: ...

    @property
    @abc.abstractmethod
    def value_bytes(self) -> int:
        """The value size: no value is longer."""

    @abc.abstractmethod
    def put(self, namespace: str, values: list[Value]) -> None:
        """Persist every value (durable when it returns, as the config's ``sync`` says); the
        card may write them in parallel, each database's together."""

    @abc.abstractmethod
    def get(self, namespace: str, wanted: list[Wanted]) -> list[bool]:
        """Read each value into its ``into``, all in one pass over the databases where the card
        can; True where every byte was verified."""

    @abc.abstractmethod
    def delete(self, namespace: str, names: Iterable[str]) -> list[bool]: ...

    @abc.abstractmethod
    def exists(self, namespace: str, names: list[str]) -> list[bool]: ...

    @abc.abstractmethod
    def databases_holding(self, namespace: str, names: list[str]) -> frozenset[int]:
        """The databases a get or delete of these values touches (for the scheduler)."""

    @abc.abstractmethod
    def pool_bytes(self, namespace: str) -> tuple[int, int]:
        """The bytes ``namespace``'s quota pool holds, and the most it may hold."""

    @abc.abstractmethod
    def recover(self) -> int: ...

    @abc.abstractmethod
    def sync_all(self) -> None: ...

    def syncs(self) -> list[Callable[[], None]]:
        """Independent syncs that together make every write so far durable. This default:
        ``sync_all`` alone."""
        return [self.sync_all]

    def write_cost(self, namespace: str, name: str, value_bytes: int) -> int:
        """The bytes a put of this value writes to the card's devices, its share of what the
        card writes beside values included: what the drive's write budget is charged. This
        default: the value's bytes."""
        return value_bytes

    def eviction_age_s(self) -> float | None:
        """How long values lately lasted before the card evicted them; None while it has not
        evicted, or when the card does not say (this default)."""
        return None

    @abc.abstractmethod
    def close(self) -> None: ...

    @abc.abstractmethod
    def statistics(self) -> CardStatistics:
        """A frozen snapshot, including ``capacity_bytes`` and ``used_bytes``."""

    def database_states(self) -> list[dict[str, object]]:
        """Per database: ``database``, ``path``, ``health`` (``ok`` or ``failing``), ``errors``,
        ``errors_last_minute``, ``last_error``; a card without devices has none to show."""
        return []
