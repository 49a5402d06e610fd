"""Remote copy, the plugin's side: the gateway copies stores out of LMCache's private L1 itself.

Where LMCache's L1 is private memory (``lmcache server`` without ``--shm-name``, as LMCache's docs
launch it), a store's bytes would otherwise be copied into the session's window by this plugin's
threads, inside LMCache's process, where the copy slows the lookups LMCache serves meanwhile. With
remote copy the plugin posts the buffer's address instead, and the gateway reads it with the
kernel's cross-memory attach (``process_vm_readv``; adp_gateway/sessions/client_process.py). Loads
are unchanged: the gateway never writes this process's memory.

The kernel decides whether the gateway may read this process: it must be the same user (or
have ``CAP_SYS_PTRACE``); where Yama restricts ptrace to descendants (``ptrace_scope`` 1, as on
Ubuntu), this process names the gateway's pid as its tracer (``PR_SET_PTRACER``, as UCX's
cross-memory transport does), only once the gateway has passed the trust checks (trust.py).
The hello carries a probe: an address holding a random token, which the gateway must read back
before it offers remote copy; where it cannot, stores take the copy path.
"""

from __future__ import annotations

import ctypes
import secrets
from pathlib import Path

from lmcache_adp.logs import log

YAMA = Path("/proc/sys/kernel/yama/ptrace_scope")
_PR_SET_PTRACER = 0x59616D61
_libc = ctypes.CDLL(None, use_errno=True)


class Probe:
    """A token in this process's memory, for the gateway to read at the handshake."""

    def __init__(self) -> None:
        self.token = secrets.randbits(63)
        self._cell = ctypes.c_uint64(self.token)
        self.address = ctypes.addressof(self._cell)


def let_read_by(gateway_pid: int) -> None:
    """Where Yama would refuse the gateway, name it as this process's tracer. Each call
    replaces the last (a new gateway after a restart); one that fails leaves the copy path."""
    try:
        scope = int(YAMA.read_text())
    except (OSError, ValueError):
        return  # no Yama: the kernel's usual same-user rule applies
    if scope != 1 or gateway_pid <= 0:
        return  # 0: nothing to lift; 2 and 3: only an administrator can
    if _libc.prctl(_PR_SET_PTRACER, gateway_pid, 0, 0, 0) != 0:
        log.info("remote copy: PR_SET_PTRACER refused (errno %d)", ctypes.get_errno())
