"""Threads that carry their names into the OS, so ``top -H``, ``ps -L``, ``perf`` and ``pidstat``
tell the plugin's and the gateway's threads apart. Python 3.11 keeps a thread's name to itself:
inside LMCache's process every thread of the plugin would show as ``lmcache``, and each of the
gateway's as ``python``. Linux only (``prctl(PR_SET_NAME)``); elsewhere the OS name is left."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable

_PR_SET_NAME = 15
COMM_BYTES = 15  # what the kernel keeps of a name (with a NUL, its 16-byte ``comm``)


def _find_prctl() -> Callable[..., int] | None:
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl


_PRCTL = _find_prctl()


def name_this_thread(name: str) -> None:
    """Give the calling thread ``name`` in the OS too (its first COMM_BYTES bytes)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_NAME, name.encode()[:COMM_BYTES], 0, 0, 0)


def name_pool_thread() -> None:
    """A ThreadPoolExecutor's ``initializer``: the pool thread's Python name, in the OS too."""
    name_this_thread(threading.current_thread().name)


class NamedThread(threading.Thread):
    """A thread that takes its name in the OS as it starts."""

    def run(self) -> None:
        name_this_thread(self.name)
        super().run()
