"""Keys that land where a test wants them in a presence table (adp_wire/presence.py)."""

from __future__ import annotations

from adp_wire.presence import fingerprint


def keys_at_home(count: int, slots: int, home: int, prefix: str = "c") -> list[str]:
    """``count`` keys whose home cell is ``home`` in a table of ``slots`` cells: one run."""
    found: list[str] = []
    i = 0
    while len(found) < count:
        key = f"{prefix}{i}"
        if fingerprint(key) & (slots - 1) == home:
            found.append(key)
        i += 1
    return found
