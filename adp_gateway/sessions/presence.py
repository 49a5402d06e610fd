"""The gateway's side of the presence tables (adp_wire/presence.py): one per tenant, kept in step
with the object store, which reports every key it comes to hold or lets go (card/holdings.py;
the store's catalog, adp_gateway/objects/catalog.py), and shared read-only with each session of
that tenant at its handshake.

A key is placed within ``PROBES_MAX`` cells of its home; one that finds no free cell there is
left out, and the table says it is not complete until every left-out key is gone. A removal
shifts the cells after it back (Knuth's algorithm R), so the table never fills with markers of
removed keys and stays as short to probe as its load allows.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections import Counter
from collections.abc import Iterable
from typing import Any

import numpy as np

from adp_wire.presence import (
    COMPLETE_OFFSET,
    EMPTY,
    HEADER,
    MAGIC,
    PROBES_MAX,
    SLOTS_MAX,
    SLOTS_MIN,
    VERSION,
    check_slots,
    fingerprint,
    table_bytes,
)
from adp_wire.sealed import sealed_memfd

OBJECT_BYTES_TYPICAL = 128 * 1024  # well under one LMCache chunk of any real model
LOAD_MAX = 0.75


def slots_for(capacity_bytes: int) -> int:
    """Cells for a card of ``capacity_bytes``: at most half full with objects this small."""
    wanted = max(1, 2 * capacity_bytes // OBJECT_BYTES_TYPICAL)
    return min(SLOTS_MAX, max(SLOTS_MIN, 1 << (wanted - 1).bit_length()))


class PresenceTable:
    """One tenant's table. Not thread-safe: ``Presence`` serializes its calls."""

    def __init__(self, slots: int) -> None:
        check_slots(slots)
        self.slots = slots
        self.fd = sealed_memfd("adp-presence", table_bytes(slots))
        self._mapping = mmap.mmap(self.fd, table_bytes(slots))
        HEADER.pack_into(self._mapping, 0, MAGIC, VERSION, slots, 1, 0)
        self._cells: np.ndarray[Any, np.dtype[np.uint64]] = np.frombuffer(
            self._mapping, np.uint64, slots, HEADER.size
        )
        self._mask = slots - 1
        self._live = 0  # keys in the table; kept under LOAD_MAX so every run ends in an empty cell
        self.left_out = 0  # keys the tenant holds that found no cell

    def add(self, key: str) -> None:
        """A key the tenant did not hold before."""
        self._add(fingerprint(key))

    def load(self, keys: Iterable[str]) -> None:
        """Keys the tenant held before this table was made (a recovery), placed all at once:
        the cells linear probing gives keys sorted by home cell, in a few numpy passes rather
        than a probe loop per key. Where that cannot be done (a table not empty, too many keys,
        a run that would leave a key beyond PROBES_MAX) each key is added on its own."""
        wanted = np.unique(np.fromiter(map(fingerprint, keys), np.uint64))
        if self._live or self.left_out or len(wanted) >= self.slots * LOAD_MAX:
            self._add_each(wanted)
            return
        home = (wanted & np.uint64(self._mask)).astype(np.int64)
        order = np.argsort(home, kind="stable")
        wanted, home = wanted[order], home[order]
        steps = np.arange(len(wanted))
        cell = np.maximum.accumulate(home - steps) + steps  # max(home, previous cell + 1)
        inside = cell < self.slots  # the rest wrap around to the table's start: added below
        if np.any(cell[inside] - home[inside] >= PROBES_MAX):
            self._add_each(wanted)
            return
        self._cells[cell[inside]] = wanted[inside]
        self._live += int(inside.sum())
        self._add_each(wanted[~inside])

    def _add_each(self, fingerprints: np.ndarray[Any, np.dtype[np.uint64]]) -> None:
        for wanted in map(int, fingerprints):
            self._add(wanted)

    def _add(self, wanted: int) -> None:
        home = wanted & self._mask
        for step in range(PROBES_MAX if self._live < self.slots * LOAD_MAX else 0):
            cell = (home + step) & self._mask
            seen = int(self._cells[cell])
            if seen == wanted:
                return  # another key with this fingerprint (2^-64): the two share a cell
            if seen == EMPTY:
                self._cells[cell] = wanted
                self._live += 1
                return
        self.left_out += 1
        self._mapping[COMPLETE_OFFSET] = 0

    def remove(self, key: str) -> None:
        """A key the tenant held."""
        hole = self._find(fingerprint(key))
        if hole is None:
            self.left_out = max(0, self.left_out - 1)
            if not self.left_out:
                self._mapping[COMPLETE_OFFSET] = 1
            return
        cell = hole
        while True:  # shift back every later key of the run that may sit in the hole
            cell = (cell + 1) & self._mask
            seen = int(self._cells[cell])
            if seen == EMPTY:
                break
            home = seen & self._mask
            if (hole - home) & self._mask < (cell - home) & self._mask:
                self._cells[hole] = seen
                hole = cell
        self._cells[hole] = EMPTY
        self._live -= 1

    @property
    def empty(self) -> bool:
        return not self._live and not self.left_out

    def read_only_fd(self) -> int:
        """A new fd of the table that cannot be mapped writable; the caller closes it."""
        return os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY | os.O_CLOEXEC)

    def close(self) -> None:
        del self._cells
        self._mapping.close()
        os.close(self.fd)

    def _find(self, wanted: int) -> int | None:
        home = wanted & self._mask
        for step in range(PROBES_MAX):
            cell = (home + step) & self._mask
            seen = int(self._cells[cell])
            if seen == wanted:
                return cell
            if seen == EMPTY:
                return None
        return None


class Presence:
    """Every tenant's table, made at the first key or session of that tenant and dropped once
    it holds no key and no session maps it, so tables are bounded by what the card holds and
    by the sessions open. Thread-safe."""

    def __init__(self, slots: int = SLOTS_MIN) -> None:
        self._slots = slots
        self._tables: dict[str, PresenceTable] = {}
        self._shared: Counter[str] = Counter()  # sessions mapping each tenant's table
        self._lock = threading.Lock()

    def added(self, tenant: str, key: str) -> None:
        with self._lock:
            self._table(tenant).add(key)

    def removed(self, tenant: str, key: str) -> None:
        with self._lock:
            self._table(tenant).remove(key)
            self._drop_if_unused(tenant)

    def recovered(self, tenant: str, keys: Iterable[str]) -> None:
        with self._lock:
            self._table(tenant).load(keys)

    def share(self, tenant: str) -> tuple[int, int]:
        """A read-only fd of ``tenant``'s table (the caller closes it) and its cell count, for
        a session, which calls ``release`` when it ends."""
        with self._lock:
            table = self._table(tenant)
            fd = table.read_only_fd()
            self._shared[tenant] += 1
            return fd, table.slots

    def release(self, tenant: str) -> None:
        with self._lock:
            self._shared[tenant] -= 1
            if self._shared[tenant] <= 0:
                del self._shared[tenant]
            self._drop_if_unused(tenant)

    def tenants(self) -> list[str]:
        """The tenants that have a table now."""
        with self._lock:
            return sorted(self._tables)

    def close(self) -> None:
        with self._lock:
            for table in self._tables.values():
                table.close()
            self._tables.clear()

    def _table(self, tenant: str) -> PresenceTable:
        table = self._tables.get(tenant)
        if table is None:
            table = self._tables[tenant] = PresenceTable(self._slots)
        return table

    def _drop_if_unused(self, tenant: str) -> None:
        table = self._tables.get(tenant)
        if table is not None and table.empty and not self._shared[tenant]:
            del self._tables[tenant]
            table.close()
