"""The drive's write budget: a token bucket of bytes.

It fills at the budget's rate (bytes per second) up to ``depth_bytes`` and starts full, so a
burst passes as long as the bucket holds it; over a long run the bytes written cannot exceed the
rate times the run plus one bucket. The operator gives the rate as bytes per second or as drive
writes per day of the configured capacity (``parse_write_budget``); the depth defaults to a
day's worth (docs/operations.md, "Choosing a write budget").

Not thread-safe: admission holds its own lock around it.
"""

from __future__ import annotations

import re

from adp_wire.errors import ConfigError
from adp_wire.units import parse_size

SECONDS_PER_DAY = 86400
_DWPD = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*dwpd\s*$", re.IGNORECASE)
_PER_SECOND = re.compile(r"^(.+?)\s*/\s*s\s*$")


def parse_write_budget(value: str | int | None, capacity_bytes: int) -> float | None:
    """``write_budget`` in bytes per second: ``none`` (None: no budget), drive writes per day of
    ``capacity_bytes`` (``1dwpd``, ``0.3 DWPD``), or a size per second (``200MiB/s``, or a
    plain number of bytes per second). Raises ConfigError naming the forms it takes."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
        return None
    hint = "write it as none, 1dwpd (drive writes per day) or 200MiB/s"
    if isinstance(value, bool):
        raise ConfigError(f"write_budget: cannot read {value!r}; {hint}")
    if isinstance(value, int):
        rate = float(value)
    elif match := _DWPD.match(value):
        rate = float(match.group(1)) * capacity_bytes / SECONDS_PER_DAY
    elif match := _PER_SECOND.match(value):
        try:
            rate = float(parse_size(match.group(1), "write_budget"))
        except ConfigError:
            raise ConfigError(f"write_budget: cannot read {value!r}; {hint}") from None
    else:
        raise ConfigError(f"write_budget: cannot read {value!r}; {hint}")
    if rate <= 0:
        raise ConfigError(f"write_budget: {value!r} allows no writes at all; {hint}, or none")
    return rate


class WriteBudget:
    def __init__(self, rate_bytes_per_s: float, depth_bytes: float, now_s: float) -> None:
        assert rate_bytes_per_s > 0 and depth_bytes > 0
        self.rate_bytes_per_s = rate_bytes_per_s
        self.depth_bytes = depth_bytes
        self._tokens = depth_bytes
        self._filled_s = now_s

    def level(self, now_s: float) -> float:
        """How full the bucket is, from 0 (empty) to 1."""
        return self.tokens(now_s) / self.depth_bytes

    def tokens(self, now_s: float) -> float:
        elapsed = max(0.0, now_s - self._filled_s)
        self._tokens = min(self.depth_bytes, self._tokens + elapsed * self.rate_bytes_per_s)
        self._filled_s = max(self._filled_s, now_s)
        return self._tokens

    def take(self, nbytes: int, now_s: float, reserve: float = 0.0) -> bool:
        """Spend ``nbytes`` if the bucket holds them and still holds ``reserve`` of its depth
        after (or, for an object larger than what that leaves to spend, if it is full: the
        bucket then owes the difference)."""
        kept = reserve * self.depth_bytes
        if self.tokens(now_s) < min(nbytes + kept, self.depth_bytes):
            return False
        self._tokens -= nbytes
        return True
