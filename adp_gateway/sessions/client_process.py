"""A client's private memory, read by the gateway itself: remote copy (docs/design.md).

An LMCache server launched as LMCache's own docs launch it keeps L1 in private memory, which no
other process maps. Rather than copy each store into the session's window inside LMCache's
process (where the copy slows the lookups LMCache serves meanwhile), the plugin lets the gateway
copy it out with the kernel's cross-memory attach (``process_vm_readv``, as MPI libraries and
UCX do between processes of one host). The kernel decides whether the gateway may: it needs
ptrace access to the client (the same user or ``CAP_SYS_PTRACE``; under Yama's
``ptrace_scope`` 1 the plugin names the gateway with ``PR_SET_PTRACER``), and a gateway in
another PID namespace cannot see the client at all. So at the handshake the gateway reads a
token at an address the hello names; only if that works does it offer remote copy.

What the gateway reads, and from whom: only addresses the client names for its own stores, and
only the process that connected (SO_PEERCRED). A pidfd pins that process: every copy is checked
against it afterwards, so a pid the client left behind and the kernel gave to another process is
never read from (a process that is still alive after the copy held its pid all along).

Reading never touches the client's memory with the gateway's CPU: ``process_vm_readv`` fails a
bad address with EFAULT, where a mapping would have to fault.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
from typing import Final

from adp_gateway.errors import StorageError
from adp_wire.checksum import Checksum

log = logging.getLogger(__name__)
# A remote store is copied and hashed this much at a time (a default fragment), so each piece
# is still in the CPU's cache when it is hashed; smaller pieces cost more system calls and GIL
# hand-overs than the hash gains on a many-core host.
PIECE_BYTES: Final = 4 * 2**20
TOKEN_BYTES: Final = 8


class _IOVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)
_process_vm_readv = _libc.process_vm_readv
_process_vm_readv.argtypes = [
    ctypes.c_int,
    ctypes.POINTER(_IOVec),
    ctypes.c_ulong,
    ctypes.POINTER(_IOVec),
    ctypes.c_ulong,
    ctypes.c_ulong,
]
_process_vm_readv.restype = ctypes.c_ssize_t


class ClientProcess:
    """The connected client's process, pinned by a pidfd, whose memory the gateway reads."""

    def __init__(self, pid: int) -> None:
        """Raises OSError when the process is gone (or pidfds are not supported)."""
        self.pid = pid
        self._pidfd = os.pidfd_open(pid)

    @classmethod
    def attach(cls, pid: int, probe: int, token: int) -> ClientProcess | None:
        """The client at ``pid`` when the kernel lets this process read it: the 8 bytes at
        ``probe`` must read back as ``token``. None otherwise, logged once with the reason."""
        if pid <= 0 or not probe:
            return None
        try:
            process = cls(pid)
        except OSError as exc:
            log.info("pid %d: no remote copy (%s); its stores use the copy path", pid, exc)
            return None
        got = bytearray(TOKEN_BYTES)
        try:
            process.read(probe, memoryview(got))
        except StorageError as exc:
            log.info(
                "pid %d: no remote copy, the kernel does not let the gateway read it (%s); its "
                "stores are copied in its own process (docs/operations.md, 'Remote copy')",
                pid,
                exc,
            )
            process.close()
            return None
        if int.from_bytes(got, "little") != token:
            log.warning("pid %d: its remote-copy probe does not read back; copy path", pid)
            process.close()
            return None
        return process

    def read(self, address: int, into: memoryview) -> None:
        """Copy ``len(into)`` bytes from ``address`` in the client into ``into`` (writable).
        Raises StorageError when the client no longer holds them, or is gone."""
        local = _IOVec(ctypes.addressof(ctypes.c_char.from_buffer(into)), len(into))
        remote = _IOVec(address, len(into))
        done = _process_vm_readv(self.pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if done < 0:
            code = ctypes.get_errno()
            raise StorageError(f"cannot read the client's memory: {os.strerror(code)}")
        if done != len(into):
            raise StorageError(f"read {done} of {len(into)} bytes of the client's memory")
        if not self.alive():  # its pid may have gone to another process: discard what came
            raise StorageError("the client's process is gone")

    def checksums(self, address: int, into: memoryview, spans: list[tuple[int, int]]) -> list[int]:
        """Copy the object at ``address`` into ``into`` a piece at a time, each piece hashed
        while the core still holds it; the payload checksum of each ``(offset, length)`` span
        (the object's fragments, in order, back to back). Raises StorageError."""
        sums = []
        for offset, length in spans:
            total = Checksum()
            for at in range(offset, offset + length, PIECE_BYTES):
                piece = into[at : min(at + PIECE_BYTES, offset + length)]
                self.read(address + at, piece)
                total.update(piece)
            sums.append(total.value())
        return sums

    def alive(self) -> bool:
        try:
            signal.pidfd_send_signal(self._pidfd, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # alive, though not ours to signal
            return True
        return True

    def close(self) -> None:
        os.close(self._pidfd)
