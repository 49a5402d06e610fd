"""Parse and print byte sizes such as ``64GiB``, ``512MiB``, ``4096`` or ``1.5TB``."""

from __future__ import annotations

import re

from adp_wire.errors import ConfigError

_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
    "K": 2**10,
    "M": 2**20,
    "G": 2**30,
    "T": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(value: str | int, field: str) -> int:
    """Return ``value`` in bytes; ``field`` names the setting in the error message."""
    if isinstance(value, bool):
        raise ConfigError(f"{field}: expected a size such as 64GiB, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"{field}: a size cannot be negative, got {value}")
        return value
    match = _SIZE.match(str(value))
    unit = match.group(2).upper() if match else ""
    if match is None or unit not in _UNITS:
        raise ConfigError(
            f"{field}: cannot read {value!r} as a size; write it like 4096, 512MiB or 64GiB"
        )
    return int(float(match.group(1)) * _UNITS[unit])


def format_size(size_bytes: int) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size_bytes >= scale:
            return f"{size_bytes / scale:.1f} {unit}"
    return f"{size_bytes} B"
