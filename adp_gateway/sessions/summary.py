"""What one session did, for the line the gateway logs when it ends::

    session 3 (pid 4242 ..., tenant 'default') closed: 8 loads (8 hits, 32.0 MiB), 8 stores ...

The session's thread and the I/O threads count into it at once, under this summary's own lock.
Work is counted when it ends, so a load or store that ends while its session closes still shows
in the line, though its completion never reached the client.
"""

from __future__ import annotations

import dataclasses
import threading

from adp_wire.protocol import Status
from adp_wire.units import format_size


@dataclasses.dataclass
class Counts:
    loads: int = 0
    load_hits: int = 0
    bytes_loaded: int = 0
    stores: int = 0
    bytes_stored: int = 0
    zero_copy: int = 0  # of the stores
    remote_copy: int = 0  # of the stores
    keys_looked_up: int = 0
    keys_found: int = 0
    refused: int = 0  # the scheduler's backlog was over its bound
    expired: int = 0
    failed: int = 0
    stores_untaken: int = 0  # the client's count: stores LMCache handed it, not stored
    bytes_untaken: int = 0


class Summary:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = Counts()
        self._folded = (0, 0)  # the client's own lookup counts, as last folded in
        self._folded_untaken = (0, 0)  # and its count of stores not taken

    def loaded(self, size: int, hit: bool) -> None:
        with self._lock:
            self._counts.loads += 1
            self._counts.load_hits += hit
            self._counts.bytes_loaded += size * hit

    def stored(self, size: int) -> None:
        with self._lock:
            self._counts.stores += 1
            self._counts.bytes_stored += size

    def zero_copy(self) -> None:
        with self._lock:
            self._counts.zero_copy += 1

    def remote_copy(self) -> None:
        with self._lock:
            self._counts.remote_copy += 1

    def looked_up(self, keys: int, found: int) -> None:
        with self._lock:
            self._counts.keys_looked_up += keys
            self._counts.keys_found += found

    def ended(self, status: Status) -> None:
        """An op completed with ``status``: counted when it was refused, expired or failed."""
        with self._lock:
            if status == Status.REJECTED:
                self._counts.refused += 1
            elif status == Status.EXPIRED:
                self._counts.expired += 1
            elif status == Status.FAILED:
                self._counts.failed += 1

    def fold_lookups(self, keys: int, found: int) -> tuple[int, int] | None:
        """Take the client's running counts of the lookups it answered itself; returns what is
        new since the last call, or None when nothing is, or the counts make no sense (the
        client's shared memory is not trusted)."""
        with self._lock:
            last_keys, last_found = self._folded
            self._folded = keys, found
            new_keys, new_found = keys - last_keys, found - last_found
        if not new_keys or not 0 <= new_found <= new_keys:
            return None
        self.looked_up(new_keys, new_found)
        return new_keys, new_found

    def fold_untaken(self, stores: int, nbytes: int) -> tuple[int, int] | None:
        """Take the client's running count of the stores it did not take (adp_wire/ring/
        layout.py, ``UNTAKEN``); returns what is new since the last call, or None when nothing
        is, or the counts went backwards (the client's shared memory is not trusted)."""
        with self._lock:
            last_stores, last_bytes = self._folded_untaken
            new = stores - last_stores, nbytes - last_bytes
            if new[0] <= 0 or new[1] < 0:
                return None
            self._folded_untaken = stores, nbytes
            self._counts.stores_untaken += new[0]
            self._counts.bytes_untaken += new[1]
        return new

    def describe(self) -> str:
        """One line, e.g. "8 loads (8 hits, 32.0 MiB), 8 stores (32.0 MiB), ..."."""
        with self._lock:
            c = dataclasses.replace(self._counts)
        return (
            f"{c.loads} loads ({c.load_hits} hits, {format_size(c.bytes_loaded)}), {c.stores} "
            f"stores ({format_size(c.bytes_stored)}), {c.keys_looked_up} keys looked up "
            f"({c.keys_found} found), {c.zero_copy} of the stores zero-copy and "
            f"{c.remote_copy} copied by the gateway; {c.refused} ops "
            f"refused (backlog over its bound), {c.expired} expired, {c.failed} failed; "
            f"{c.stores_untaken} stores not taken ({format_size(c.bytes_untaken)})"
        )
