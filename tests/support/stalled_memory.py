"""Memory that never answers a read until released: anonymous pages registered with
userfaultfd for missing-page faults, which nobody serves. A process that reads them, this one or
another through ``process_vm_readv``, waits in the kernel until ``release`` closes the
userfaultfd, after which they read as zeros. It stands for a client whose memory the gateway
cannot read in time (a segment on a hung FUSE or NFS mount, or pages a lazy restore still
holds back). A process forked after it keeps the userfaultfd open, and readers wait for that
copy to close too."""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import struct

import pytest

_SYSCALL = {"x86_64": 323, "aarch64": 282}  # userfaultfd(2)
_UFFDIO_API = 0xC018AA3F
_UFFDIO_REGISTER = 0xC020AA00
_UFFD_API = 0xAA
_UFFDIO_REGISTER_MODE_MISSING = 1


class StalledMemory:
    def __init__(self, nbytes: int) -> None:
        """Skips the test where this kernel or user may not create a userfaultfd (it needs
        CAP_SYS_PTRACE, or vm.unprivileged_userfaultfd set, to stall another process's reads)."""
        libc = ctypes.CDLL(None, use_errno=True)
        number = _SYSCALL.get(os.uname().machine)
        fd = -1 if number is None else libc.syscall(number, os.O_CLOEXEC | os.O_NONBLOCK)
        if fd < 0:
            pytest.skip(f"no userfaultfd here: {os.strerror(ctypes.get_errno())}")
        self._fd = fd
        self._mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        start = ctypes.addressof(ctypes.c_char.from_buffer(self._mapping))
        try:
            fcntl.ioctl(fd, _UFFDIO_API, bytearray(struct.pack("QQQ", _UFFD_API, 0, 0)))
            registration = struct.pack("QQQQ", start, nbytes, _UFFDIO_REGISTER_MODE_MISSING, 0)
            fcntl.ioctl(fd, _UFFDIO_REGISTER, bytearray(registration))
        except OSError:
            self.release()
            raise
        self.memory = memoryview(self._mapping)

    def release(self) -> None:
        """Let every read waiting on the pages go on (they read zeros from then on)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
