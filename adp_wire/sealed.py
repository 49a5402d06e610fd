"""Shared memory that one side makes (a memfd) and the other maps: sealed at its size when made,
and checked sealed before it is mapped, so that its maker cannot shrink it under the other's
mapping, whose next touch past the new end would be a SIGBUS in that process (LMCache's, for
the plugin)."""

from __future__ import annotations

import fcntl
import os

from adp_wire.errors import ProtocolError

SIZE_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def sealed_memfd(name: str, size: int) -> int:
    """A new memfd of ``size`` bytes whose size no one can change."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SIZE_SEALS)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_sealed(fd: int, what: str) -> None:
    """Raises ProtocolError, naming ``what``, unless ``fd`` is a memfd sealed at its size."""
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError as exc:
        raise ProtocolError(f"{what} is not a sealed memfd ({exc})") from exc
    if seals & SIZE_SEALS != SIZE_SEALS:
        raise ProtocolError(f"{what} is not sealed at its size: its maker could shrink it")
