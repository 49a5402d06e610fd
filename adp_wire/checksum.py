"""The one checksum of the project: xxh3_64 (about 20 GB/s, and it releases the GIL).

It guards record headers and payloads on disk (adp_gateway/card/software/format.py). ``Checksum``
takes the same value of data that comes in pieces (a zero-copy store's L1, read a chunk at a time).
"""

from __future__ import annotations

import xxhash


def checksum(data: bytes | memoryview, seed: int = 0) -> int:
    return int(xxhash.xxh3_64_intdigest(data, seed))


class Checksum:
    """``checksum`` of the pieces given to ``update``, in order, as if joined."""

    def __init__(self, seed: int = 0) -> None:
        self._state = xxhash.xxh3_64(seed=seed)

    def update(self, data: bytes | memoryview) -> None:
        self._state.update(data)

    def value(self) -> int:
        return int(self._state.intdigest())


def key_hash(namespace: str, key: str) -> int:
    """The hash of a key within its namespace: where an object's first fragment goes
    (adp_wire/fragmenter.py) and the key's fingerprint in a record's header on disk."""
    return int(xxhash.xxh3_64_intdigest(f"{namespace}\0{key}".encode()))
