"""The card seam: the one interface the gateway above (sessions, scheduler, service, tenants)
stores through. Everything below it (how records are laid out, indexed, evicted and recovered)
is the card's own business.

The surface is key-value. A value is one object of a tenant, named by ``(tenant, key)``; the
card stores it as fragments of at most ``fragment_bytes`` (its value size), fragment ``i`` on
database ``fragment_plan(...)[i].database`` (adp_wire/fragmenter.py decides, so every card
stripes an object the same way and the scheduler can plan a store before it runs). Databases are
the card's independent queues (one per drive on the software card): I/O on one never waits for
another's.

Contract, for every implementation (tests/unit/test_card_contract.py runs it on each):

=================  ===============================================================================
call               promise
=================  ===============================================================================
``put``            persists ``extent[:object_bytes]``; afterwards ``exists`` is True and ``get``
                   returns those bytes, until a ``delete``, an overwrite or an eviction. An object
                   already stored with the same length is not written again (keys name content).
                   Another length replaces the old version, which never comes back. Raises
                   ``StorageError`` when the card failed; nothing is then published.
``get``            True only when every byte read into ``extent`` was verified; else a miss (False),
                   never wrong bytes. A corrupt value is dropped. ``get_many``: the same for
                   several values, each with its own answer.
``delete``         per key, whether it was there; a deleted value never comes back, even after a
                   restart. Raises ``StorageError`` (nothing deleted) when it cannot be recorded.
``exists``         answered from memory, never from the device.
``holdings``       the card tells ``CardContext.holdings`` of every key it comes to hold
                   (a put of a new key, recovery) and every key it lets go (a delete, an
                   eviction, a value found corrupt), so the gateway's presence tables
                   (adp_gateway/presence.py) answer as ``exists`` would.
``recover``        call once, before anything else: rebuilds what a persistent card held (a
                   volatile card starts empty) and returns how many values it found.
``sync_all``       every write so far is durable (a no-op on a volatile card).
``close``          durable and closed; the card is not used again.
=================  ===============================================================================

Capacity: ``used_bytes <= capacity_bytes`` always; a full card evicts (in its own order) to make
room, so a ``put`` never fails for want of space. A tenant with a quota (``pool_bytes``) evicts
only its own values.

Buffers: ``extent`` is page aligned, its length a multiple of 4 KiB; the card only reads it
during ``put`` and writes it during ``get``, and keeps no reference after the call returns.

Thread-safety: every call may run concurrently from the gateway's I/O threads, except
``recover`` (before the first) and ``close`` (after the last).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, ClassVar

from adp_gateway.card.holdings import Holdings
from adp_gateway.format import key_hash  # places an object's first fragment: part of the layout
from adp_wire import fragmenter

if TYPE_CHECKING:
    from adp_gateway.card.software.devices.base import Device
    from adp_gateway.config import GatewayConfig

__all__ = [
    "BuiltinCard",
    "Card",
    "CardContext",
    "CardStatistics",
    "Holdings",
    "Wanted",
    "key_hash",
]

Wanted = tuple[str, memoryview, int]  # a load: key, the extent to read into, object bytes


class BuiltinCard(StrEnum):
    """The cards in the tree, by the name the config's ``card`` key gives them."""

    SOFTWARE = "software"  # the region log over files or block devices (card/software/)
    MEMORY = "memory"  # a dict in memory: volatile, for tests and as the seam's second witness


@dataclass(frozen=True)
class CardStatistics:
    objects: int
    used_bytes: int
    capacity_bytes: int
    loads: int
    load_misses: int
    stores: int
    stores_skipped: int
    verify_failures: int
    reclaims: int  # evictions of a region (software card) or a value (memory card)
    tombstones: int


@dataclass(frozen=True)
class CardContext:
    """What the gateway hands a card it opens.

    ``on_written``: a put calls it from its thread once its writes have landed, before it waits
    for a sync (the scheduler then lets the next store's writes go). ``wrap_device(database,
    path, device)``: a card with devices passes each through it, and uses what it returns (the
    gateway counts each device's errors for its status, and tests inject faults); cards
    without devices never call it. ``holdings``: see card/holdings.py."""

    on_written: Callable[[], None]
    wrap_device: Callable[[int, str, Device], Device]
    holdings: Holdings


class Card(abc.ABC):
    """A key-value card. Subclasses implement the abstract calls; the fragment plan is shared."""

    persistent: ClassVar[bool]  # whether values survive a close and reopen (``recover``)

    @classmethod
    @abc.abstractmethod
    def open(cls, config: GatewayConfig, context: CardContext) -> Card:
        """The card the config describes (its databases, capacity, fragment size, quotas);
        not yet recovered. Raises StartupError or ConfigError with a hint."""

    @property
    @abc.abstractmethod
    def databases(self) -> int: ...

    @property
    @abc.abstractmethod
    def fragment_bytes(self) -> int:
        """The value size: no fragment is larger."""

    @abc.abstractmethod
    def put(
        self,
        tenant: str,
        key: str,
        extent: memoryview,
        object_bytes: int,
        checksums: list[int] | None = None,
    ) -> None:
        """Persist ``extent[:object_bytes]``. ``checksums`` (one per fragment) come with a
        zero-copy store: ``extent`` is then the client's memory, which the card must not pad or
        modify; a value whose bytes changed under the write fails its first load."""

    @abc.abstractmethod
    def get(self, tenant: str, key: str, extent: memoryview, object_bytes: int) -> bool: ...

    def get_many(self, tenant: str, objects: list[Wanted]) -> list[bool]:
        """``get`` of each ``(key, extent, object_bytes)``; a card may read them together
        (the session hands a doorbell's small loads over as one)."""
        return [self.get(tenant, key, extent, size) for key, extent, size in objects]

    @abc.abstractmethod
    def delete(self, tenant: str, keys: Iterable[str]) -> list[bool]: ...

    @abc.abstractmethod
    def exists(self, tenant: str, keys: list[str]) -> list[bool]: ...

    @abc.abstractmethod
    def databases_holding(self, tenant: str, keys: list[str]) -> frozenset[int]:
        """The databases a load or delete of these objects touches (for the scheduler)."""

    @abc.abstractmethod
    def pool_bytes(self, tenant: str) -> tuple[int, int]:
        """The bytes ``tenant``'s quota pool holds, and the most it may hold."""

    @abc.abstractmethod
    def recover(self) -> int: ...

    @abc.abstractmethod
    def sync_all(self) -> None: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    @abc.abstractmethod
    def statistics(self) -> CardStatistics:
        """A frozen snapshot, including ``capacity_bytes`` and ``used_bytes``."""

    def fragment_count(self, object_bytes: int) -> int:
        """How many fragments (and checksums) an object of ``object_bytes`` is stored as."""
        return fragmenter.count(object_bytes, self.fragment_bytes)

    def fragment_plan(self, tenant: str, key: str, object_bytes: int) -> list[fragmenter.Fragment]:
        """Where each fragment of this object goes."""
        return fragmenter.plan(
            object_bytes, self.fragment_bytes, self.databases, key_hash(tenant, key)
        )

    def databases_to_store(self, tenant: str, key: str, object_bytes: int) -> frozenset[int]:
        """The databases a store of this object writes (for the scheduler)."""
        return frozenset(f.database for f in self.fragment_plan(tenant, key, object_bytes))
