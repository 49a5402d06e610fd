"""Doorbells: the eventfds by which each side of a session wakes the other, and by which the
plugin's threads wake its link's thread and LMCache.

Whoever queues work rings (adds 1); whoever is woken answers (reads the count back to 0) before
it takes what is queued, so a ring that comes while it takes is not lost, and one wake-up may
stand for many entries. Doorbells never block: an answer with nothing rung is a no-op.
"""

from __future__ import annotations

import contextlib
import os

from adp_wire.errors import ProtocolError


def new() -> int:
    return os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)


def ring(fd: int) -> None:
    os.eventfd_write(fd, 1)


def answer(fd: int) -> None:
    with contextlib.suppress(BlockingIOError):
        os.eventfd_read(fd)


def check(fd: int, what: str) -> None:
    """Raises ProtocolError, naming ``what``, unless ``fd`` is an eventfd; makes it non-blocking
    (an answer on a blocking one with nothing rung would hang its thread)."""
    try:
        kind = os.readlink(f"/proc/self/fd/{fd}")
    except OSError as exc:
        raise ProtocolError(f"{what} is not an open fd ({exc})") from exc
    if kind != "anon_inode:[eventfd]":
        raise ProtocolError(f"{what} is {kind}, not an eventfd")
    os.set_blocking(fd, False)
