"""The memory card: values in a dict, least recently used evicted first. Volatile: a restart
starts empty, as its ``recover`` says.

It exists to prove the card seam (docs/design.md, "The card seam"): it runs the same contract
suite as the software card (tests/unit/test_card_contract.py), and a gateway with ``card:
memory`` serves clients like any other. It keeps each fragment's checksum, so a zero-copy store
whose bytes changed under the write is a miss at its first load here too.

Space: a value counts its fragments' bytes, each rounded up to 4 KiB (as a record's payload is).
A tenant with a quota evicts only its own values to stay within it; the others share what the
quotas leave, and evict one another's.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from adp_gateway.card.base import Card, CardContext, CardStatistics, Holdings
from adp_gateway.card.holdings import NO_HOLDINGS
from adp_gateway.config import GatewayConfig
from adp_gateway.errors import StorageError
from adp_wire.checksum import checksum
from adp_wire.ring.layout import align_up

ObjectId = tuple[str, str]  # (tenant, key)
SHARED = ""  # the pool of the tenants without a quota


@dataclass(frozen=True)
class _Value:
    data: bytes
    checksums: tuple[int, ...]  # one per fragment
    databases: frozenset[int]
    stored_bytes: int


class MemoryCard(Card):
    persistent = False

    def __init__(
        self,
        databases: int,
        capacity_bytes: int,
        fragment_bytes: int,
        quotas: Mapping[str, int] | None = None,
        holdings: Holdings = NO_HOLDINGS,
    ) -> None:
        """``quotas``: tenant -> the bytes it may hold; the others share what is left."""
        assert databases > 0 and fragment_bytes > 0
        self._databases = databases
        self._capacity_bytes = capacity_bytes
        self._fragment_bytes = fragment_bytes
        self._quotas = dict(quotas or {})
        self._holdings = holdings
        self._lock = threading.Lock()
        self._values: OrderedDict[ObjectId, _Value] = OrderedDict()  # least recently used first
        self._pool_used: dict[str, int] = {}
        self._counts = dict.fromkeys(
            ("loads", "load_misses", "stores", "stores_skipped", "verify_failures", "reclaims"), 0
        )

    @classmethod
    def open(cls, config: GatewayConfig, context: CardContext) -> MemoryCard:
        assert config.capacity is not None
        quotas = {t.name: t.quota for t in config.tenants if t.quota is not None}
        return cls(
            len(config.database_paths),
            config.capacity,
            config.fragment_size,
            quotas,
            context.holdings,
        )

    @property
    def databases(self) -> int:
        return self._databases

    @property
    def fragment_bytes(self) -> int:
        return self._fragment_bytes

    def put(
        self,
        tenant: str,
        key: str,
        extent: memoryview,
        object_bytes: int,
        checksums: list[int] | None = None,
    ) -> None:
        plan = self.fragment_plan(tenant, key, object_bytes)
        data = bytes(extent[:object_bytes])
        if checksums is None:
            checksums = [checksum(extent[f.offset : f.offset + f.length]) for f in plan]
        stored_bytes = sum(align_up(f.length) for f in plan)
        value = _Value(data, tuple(checksums), frozenset(f.database for f in plan), stored_bytes)
        with self._lock:
            old = self._values.get((tenant, key))
            if old is not None and len(old.data) == object_bytes:
                self._counts["stores_skipped"] += 1
                return
            if old is not None:
                self._remove((tenant, key))
            self._make_room(self._pool(tenant), stored_bytes)
            self._values[(tenant, key)] = value
            self._add_used(self._pool(tenant), stored_bytes)
            self._holdings.added(tenant, key)
            self._counts["stores"] += 1

    def get(self, tenant: str, key: str, extent: memoryview, object_bytes: int) -> bool:
        with self._lock:
            self._counts["loads"] += 1
            value = self._values.get((tenant, key))
            if value is None or len(value.data) != object_bytes:
                self._counts["load_misses"] += 1
                return False
            self._values.move_to_end((tenant, key))
        extent[:object_bytes] = value.data
        if not self._intact(tenant, key, extent, object_bytes, value):
            with self._lock:
                self._counts["verify_failures"] += 1
                self._counts["load_misses"] += 1
                if self._values.get((tenant, key)) is value:
                    self._remove((tenant, key))
            return False
        return True

    def _intact(
        self, tenant: str, key: str, extent: memoryview, object_bytes: int, value: _Value
    ) -> bool:
        plan = self.fragment_plan(tenant, key, object_bytes)
        return all(
            checksum(extent[f.offset : f.offset + f.length]) == value.checksums[f.number]
            for f in plan
        )

    def delete(self, tenant: str, keys: Iterable[str]) -> list[bool]:
        with self._lock:
            return [self._remove((tenant, key)) for key in keys]

    def exists(self, tenant: str, keys: list[str]) -> list[bool]:
        with self._lock:
            return [(tenant, key) in self._values for key in keys]

    def databases_holding(self, tenant: str, keys: list[str]) -> frozenset[int]:
        with self._lock:
            found = (self._values.get((tenant, key)) for key in keys)
            return frozenset(d for value in found if value is not None for d in value.databases)

    def pool_bytes(self, tenant: str) -> tuple[int, int]:
        pool = self._pool(tenant)
        with self._lock:
            return self._pool_used.get(pool, 0), self._pool_limit(pool)

    def recover(self) -> int:
        return len(self._values)  # volatile: nothing survives a restart

    def sync_all(self) -> None:
        pass

    def close(self) -> None:
        with self._lock:
            self._values.clear()
            self._pool_used.clear()

    def statistics(self) -> CardStatistics:
        with self._lock:
            return CardStatistics(
                objects=len(self._values),
                used_bytes=sum(self._pool_used.values()),
                capacity_bytes=self._capacity_bytes,
                tombstones=0,
                **self._counts,
            )

    def _pool(self, tenant: str) -> str:
        return tenant if tenant in self._quotas else SHARED

    def _pool_limit(self, pool: str) -> int:
        if pool != SHARED:
            return self._quotas[pool]
        return self._capacity_bytes - sum(self._quotas.values())

    def _make_room(self, pool: str, stored_bytes: int) -> None:
        """Under the lock: evict the pool's least recently used values until ``stored_bytes``
        fit in it."""
        limit = self._pool_limit(pool)
        if stored_bytes > limit:
            raise StorageError(
                f"a value of {stored_bytes} bytes does not fit the card's "
                f"{'pool of ' + repr(pool) if pool else 'shared space'} ({limit} bytes): "
                "raise `capacity` or the quota"
            )
        while self._pool_used.get(pool, 0) + stored_bytes > limit:
            victim = next(oid for oid in self._values if self._pool(oid[0]) == pool)
            self._remove(victim)
            self._counts["reclaims"] += 1

    def _remove(self, object_id: ObjectId) -> bool:
        """Under the lock."""
        value = self._values.pop(object_id, None)
        if value is None:
            return False
        self._add_used(self._pool(object_id[0]), -value.stored_bytes)
        self._holdings.removed(*object_id)
        return True

    def _add_used(self, pool: str, delta: int) -> None:
        self._pool_used[pool] = self._pool_used.get(pool, 0) + delta
