"""Split an object into fragments of at most ``fragment_bytes_max`` spread over the databases.

Pure: it decides and does no I/O. Fragment ``i`` goes to database ``(key_hash + i) % databases``,
so one object's fragments stripe over every database and a read of it uses all of them.
"""

from __future__ import annotations

from typing import NamedTuple


class Fragment(NamedTuple):
    number: int
    offset: int
    length: int
    database: int


def count(object_bytes: int, fragment_bytes_max: int) -> int:
    """How many fragments an object is stored as (one even when it is empty)."""
    return max(1, -(-object_bytes // fragment_bytes_max))


def plan(
    object_bytes: int, fragment_bytes_max: int, databases: int, key_hash: int
) -> list[Fragment]:
    assert fragment_bytes_max > 0 and databases > 0 and object_bytes >= 0
    return [
        Fragment(
            number=i,
            offset=i * fragment_bytes_max,
            length=min(fragment_bytes_max, object_bytes - i * fragment_bytes_max),
            database=(key_hash + i) % databases,
        )
        for i in range(count(object_bytes, fragment_bytes_max))
    ]
