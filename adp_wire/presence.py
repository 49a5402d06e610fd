"""The presence table: which keys a tenant holds, in shared memory the plugin reads itself.

LMCache asks its L2 adapter EXISTS on every lookup (even for a prompt wholly in its L1) and
waits for the answer. Through the ring that answer costs two wake-ups, the plugin's I/O thread and
the gateway's session thread, and on a host whose cores are busy writing through each may wait
for a CPU. So the gateway keeps one table per tenant, a hash set of key fingerprints in a memfd
that every session of that tenant maps read-only, and the plugin answers EXISTS in the submit
call itself (docs/design.md, "Lookups").

Layout (little endian): a 64-byte header, then ``slots`` u64 cells (``slots`` a power of two)::

    0   magic "ADPPRES1" · u32 version · u32 slots · u32 complete · u32 reserved · 40 reserved
    64  cells: 0 empty, else the fingerprint of a key the tenant holds

A key's fingerprint is the xxh3_64 of its UTF-8 bytes (0 moved to 1); it lives within
``PROBES_MAX`` cells after ``fingerprint & (slots - 1)`` (linear probing, wrapping around).
``complete`` is 1 while every key of the tenant is in the table; when the gateway cannot place a
key it leaves it out and clears ``complete`` until that key is gone again, and the plugin asks the
gateway (through the ring) about the keys it does not find.

One writer (the gateway, under its lock); readers take no lock. A reader racing a write may miss
a key being added or moved (a miss: LMCache recomputes that chunk), or still see one being
removed, as a lookup racing an eviction through the ring would; it never finds a key the tenant
never held, but for a 64-bit fingerprint collision, which a load then answers as a miss.
"""

from __future__ import annotations

import mmap
import os
import struct
from typing import Any

import numpy as np
import xxhash

from adp_wire.errors import ProtocolError
from adp_wire.sealed import check_sealed

MAGIC = b"ADPPRES1"
VERSION = 1
HEADER = struct.Struct("<8sIIII40x")  # magic, version, slots, complete, reserved
COMPLETE_OFFSET = 16
EMPTY = 0
PROBES_MAX = 32  # a key sits at most this many cells past its home; a reader looks no further
SLOTS_MIN = 1 << 10
SLOTS_MAX = 1 << 24  # 128 MiB of cells, touched only as keys arrive


def fingerprint(key: str) -> int:
    return int(xxhash.xxh3_64_intdigest(key.encode())) or 1


def table_bytes(slots: int) -> int:
    return HEADER.size + slots * 8


def check_slots(slots: int) -> None:
    if not SLOTS_MIN <= slots <= SLOTS_MAX or slots & (slots - 1):
        raise ProtocolError(
            f"presence table of {slots} slots: not a power of two in [{SLOTS_MIN}, {SLOTS_MAX}]"
        )


class PresenceView:
    """A plugin's read-only map of its tenant's table. It has no ``close``: the mapping goes
    with the last reference, so a lookup running on another thread never finds it gone."""

    def __init__(self, fd: int, slots: int) -> None:
        """Maps ``fd`` (which the caller still owns). Raises ProtocolError when it is not a
        table of ``slots`` cells."""
        check_slots(slots)
        check_sealed(fd, "the presence table")
        try:
            size = os.fstat(fd).st_size
            if size != table_bytes(slots):
                raise ProtocolError(f"presence table is {size} bytes, not {table_bytes(slots)}")
            self._mapping = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        except OSError as exc:
            raise ProtocolError(f"the presence table does not map: {exc}") from exc
        magic, version, have_slots, _, _ = HEADER.unpack_from(self._mapping, 0)
        if (magic, version, have_slots) != (MAGIC, VERSION, slots):
            self._mapping.close()
            raise ProtocolError("presence table header does not match the welcome")
        self._cells: np.ndarray[Any, np.dtype[np.uint64]] = np.frombuffer(
            self._mapping, np.uint64, slots, HEADER.size
        )
        self._mask = np.uint64(slots - 1)

    @property
    def complete(self) -> bool:
        return bool(self._mapping[COMPLETE_OFFSET])

    def find(self, keys: list[str]) -> list[bool] | None:
        """Whether the tenant holds each key; None when a key is not in the table and the
        table is not complete (then only the gateway knows)."""
        complete = self.complete  # read first: a key left out clears it before it is stored
        wanted = np.fromiter(map(fingerprint, keys), np.uint64, len(keys))
        found = np.zeros(len(keys), bool)
        pending = np.arange(len(keys))
        cell = wanted & self._mask
        for _ in range(PROBES_MAX):
            seen = self._cells[cell[pending]]
            hit = seen == wanted[pending]
            found[pending[hit]] = True
            pending = pending[~hit & (seen != EMPTY)]
            if not pending.size:
                break
            cell[pending] = (cell[pending] + np.uint64(1)) & self._mask
        if not complete and not found.all():
            return None
        return found.tolist()
