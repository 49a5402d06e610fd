"""The memory card: values in a dict, least recently used evicted first. Volatile: a restart
starts empty, as its ``recover`` says.

It exists to prove the card seam (docs/design.md, "The card seam"): it runs the same contract
suite as the software card (tests/unit/test_card_contract.py), and a gateway with ``card:
memory`` serves clients like any other. It keeps each value's checksum, so a zero-copy store
whose bytes changed under the write is a miss at its first get here too.

Space: a value counts its bytes rounded up to 4 KiB (as a record's payload is). A namespace with
a quota evicts only its own values to stay within it; the others share what the quotas leave,
and evict one another's.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from adp_gateway.card.base import (
    Card,
    CardConfig,
    CardContext,
    CardStatistics,
    Holdings,
    Value,
    Wanted,
)
from adp_gateway.card.holdings import NO_HOLDINGS
from adp_gateway.errors import StorageError
from adp_wire.checksum import checksum
from adp_wire.ring.layout import align_up

ValueId = tuple[str, str]  # (namespace, name)
SHARED = ""  # the pool of the namespaces without a quota


@dataclass(frozen=True)
class _Held:
    data: bytes
    checksum: int
    database: int


class MemoryCard(Card):
    persistent = False

    def __init__(
        self,
        databases: int,
        capacity_bytes: int,
        value_bytes: int,
        quotas: Mapping[str, int] | None = None,
        holdings: Holdings = NO_HOLDINGS,
    ) -> None:
        """``quotas``: namespace -> the bytes it may hold; the others share what is left."""
        assert databases > 0 and value_bytes > 0
        self._databases = databases
        self._capacity_bytes = capacity_bytes
        self._value_bytes = value_bytes
        self._quotas = dict(quotas or {})
        self._holdings = holdings
        self._lock = threading.Lock()
        self._values: OrderedDict[ValueId, _Held] = OrderedDict()  # least recently used first
        self._pool_used: dict[str, int] = {}
        self._verify_failures = self._reclaims = 0

    @classmethod
    def open(cls, config: CardConfig, context: CardContext) -> MemoryCard:
        assert config.capacity is not None
        quotas = config.quotas
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
    def value_bytes(self) -> int:
        return self._value_bytes

    def put(self, namespace: str, values: list[Value]) -> None:
        pool = self._pool(namespace)
        held = []
        for value in values:
            assert value.length <= self._value_bytes and 0 <= value.database < self._databases
            data = bytes(value.payload[: value.length])
            value_sum = checksum(data) if value.checksum is None else value.checksum
            held.append(((namespace, value.name), _Held(data, value_sum, value.database)))
        with self._lock:
            # All or nothing: values that together exceed the pool would evict one another.
            self._make_room(pool, sum(align_up(len(h.data)) for _, h in held), evict=False)
            try:
                for value_id, value_held in held:
                    self._remove(value_id)
                    self._make_room(pool, align_up(len(value_held.data)))
                    self._values[value_id] = value_held
                    self._add_used(pool, align_up(len(value_held.data)))
                    self._holdings.added(*value_id)
            except StorageError:
                for value_id, _ in held:
                    self._remove(value_id)  # no value of a failed put is held
                raise

    def get(self, namespace: str, wanted: list[Wanted]) -> list[bool]:
        return [self._get((namespace, name), into, length) for name, into, length in wanted]

    def _get(self, value_id: ValueId, into: memoryview, length: int) -> bool:
        with self._lock:
            held = self._values.get(value_id)
            if held is None or len(held.data) != length:
                return False
            self._values.move_to_end(value_id)
        into[:length] = held.data
        if checksum(into[:length]) == held.checksum:
            return True
        with self._lock:
            self._verify_failures += 1
            if self._values.get(value_id) is held:
                self._remove(value_id)
        return False

    def delete(self, namespace: str, names: Iterable[str]) -> list[bool]:
        with self._lock:
            return [self._remove((namespace, name)) for name in names]

    def exists(self, namespace: str, names: list[str]) -> list[bool]:
        with self._lock:
            return [(namespace, name) in self._values for name in names]

    def databases_holding(self, namespace: str, names: list[str]) -> frozenset[int]:
        with self._lock:
            found = (self._values.get((namespace, name)) for name in names)
            return frozenset(held.database for held in found if held is not None)

    def pool_bytes(self, namespace: str) -> tuple[int, int]:
        pool = self._pool(namespace)
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
                values=len(self._values),
                used_bytes=sum(self._pool_used.values()),
                capacity_bytes=self._capacity_bytes,
                verify_failures=self._verify_failures,
                reclaims=self._reclaims,
                tombstones=0,
            )

    def _pool(self, namespace: str) -> str:
        return namespace if namespace in self._quotas else SHARED

    def _pool_limit(self, pool: str) -> int:
        if pool != SHARED:
            return self._quotas[pool]
        return self._capacity_bytes - sum(self._quotas.values())

    def _make_room(self, pool: str, stored_bytes: int, evict: bool = True) -> None:
        """Under the lock: evict the pool's least recently used values until ``stored_bytes``
        fit in it (``evict`` False: only check that they can)."""
        limit = self._pool_limit(pool)
        if stored_bytes > limit:
            raise StorageError(
                f"{stored_bytes} bytes do not fit the card's "
                f"{'pool of ' + repr(pool) if pool else 'shared space'} ({limit} bytes): "
                "raise `capacity` or the quota"
            )
        while evict and self._pool_used.get(pool, 0) + stored_bytes > limit:
            victim = next(vid for vid in self._values if self._pool(vid[0]) == pool)
            self._remove(victim)
            self._reclaims += 1

    def _remove(self, value_id: ValueId) -> bool:
        """Under the lock."""
        held = self._values.pop(value_id, None)
        if held is None:
            return False
        self._add_used(self._pool(value_id[0]), -align_up(len(held.data)))
        self._holdings.removed(*value_id)
        return True

    def _add_used(self, pool: str, delta: int) -> None:
        self._pool_used[pool] = self._pool_used.get(pool, 0) + delta
