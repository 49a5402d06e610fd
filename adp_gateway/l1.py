"""A client's L1 segment, mapped read-only by the gateway for zero-copy stores.

``lmcache server --shm-name NAME`` keeps LMCache's L1 in the shared-memory file
``/dev/shm/lmcache_l1_pool_NAME``. The plugin sends a read-only fd of that file with its hello;
the gateway maps it read-only and writes a zero-copy store with O_DIRECT straight from those
pages to the disk. So the gateway cannot write L1 at all, and it never reads L1 with the CPU
either: only the kernel does, inside ``pwritev``, so a client that shrinks its segment gets
EFAULT (a failed store), not a gateway killed by SIGBUS. Payload checksums are the plugin's work
for the same reason (docs/design.md, "Zero-copy stores").
"""

from __future__ import annotations

import mmap
import os
import stat

from adp_gateway.errors import ProtocolError
from adp_wire.ring.layout import PAGE_BYTES, align_up


class L1Segment:
    def __init__(self, fd: int, claimed_bytes: int) -> None:
        """Map the segment behind ``fd`` (not taken over: the caller closes it)."""
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ProtocolError("the L1 segment's fd is not a shared-memory file")
        if info.st_size != claimed_bytes or claimed_bytes % PAGE_BYTES or not claimed_bytes:
            raise ProtocolError(
                f"the L1 segment is {info.st_size} bytes; the hello said {claimed_bytes}, "
                "a non-zero multiple of 4 KiB"
            )
        try:
            self._mapping = mmap.mmap(fd, claimed_bytes, prot=mmap.PROT_READ)
        except OSError as exc:
            raise ProtocolError(f"the L1 segment cannot be mapped: {exc.strerror}") from exc
        self._memory = memoryview(self._mapping)
        self.size = claimed_bytes

    def pages(self, offset: int, nbytes: int) -> memoryview:
        """The whole pages holding ``nbytes`` at ``offset``, for O_DIRECT writes only."""
        end = offset + align_up(nbytes)
        if offset % PAGE_BYTES or nbytes <= 0 or end > self.size:
            raise ProtocolError(
                f"L1 range [{offset}, {end}) is unaligned, empty or outside the "
                f"{self.size}-byte segment"
            )
        return self._memory[offset:end]
