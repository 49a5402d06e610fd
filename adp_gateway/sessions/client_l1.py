"""A client's L1 segment, mapped read-only by the gateway for zero-copy stores, and the gate
that holds the session open while the kernel reads it (``L1Readers``).

``lmcache server --shm-name NAME`` keeps LMCache's L1 in the shared-memory file
``/dev/shm/lmcache_l1_pool_NAME``. The plugin sends a read-only fd of that file with its hello;
the gateway maps it read-only and writes a zero-copy store with O_DIRECT straight from those
pages to the disk. So the gateway cannot write L1 at all, and it never reads the mapping with the
CPU either: only the kernel does, inside ``pwritev``, and the payload checksums are taken from
what ``preadv`` of the segment's fd reads, a chunk at a time, so a client that shrinks its
segment gets a failed store (EFAULT, or a short read), not a gateway killed by SIGBUS
(docs/design.md, "Zero-copy stores").
"""

from __future__ import annotations

import contextlib
import mmap
import os
import stat
import threading
from collections.abc import Callable, Iterator

from adp_gateway.errors import ProtocolError, StorageError
from adp_wire.checksum import Checksum
from adp_wire.ring.layout import PAGE_BYTES, align_up

CHECKSUM_CHUNK_BYTES = 2**20  # read into a buffer that stays in the core's cache, then hashed


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
        self._fd = os.dup(fd)  # for checksums: read through the kernel, never the mapping
        self._chunks = threading.local()  # each I/O thread's chunk buffer
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

    def checksum(self, offset: int, length: int) -> int:
        """The payload checksum of ``length`` bytes of L1 at ``offset``; raises StorageError
        when the segment no longer holds them (its client shrank it)."""
        chunk = self._chunk()
        total = Checksum()
        done = 0
        while done < length:
            part = chunk[: min(len(chunk), length - done)]
            try:
                got = os.preadv(self._fd, [part], offset + done)
            except OSError as exc:
                raise StorageError(f"the client's L1 segment cannot be read: {exc}") from exc
            if got <= 0:
                raise StorageError("the client's L1 segment shrank under a zero-copy store")
            total.update(part[:got])
            done += got
        return total.value()

    def close(self) -> None:
        """Once no store reads the segment any more."""
        os.close(self._fd)

    def _chunk(self) -> memoryview:
        chunk: memoryview | None = getattr(self._chunks, "buffer", None)
        if chunk is None:
            chunk = self._chunks.buffer = memoryview(mmap.mmap(-1, CHECKSUM_CHUNK_BYTES))
        return chunk


class L1Readers:
    """Counts zero-copy stores in while the kernel reads their L1 pages; once closed, none
    starts, and what ``close`` was given to do once they are all out (let go of the client's
    L1 and close its socket) runs when the last one inside has left: at once when none is, or
    on that store's thread. So a client that sees EOF knows the gateway has let go of its L1
    (docs/design.md, "Zero-copy stores"), and a session closes without waiting for an
    O_DIRECT write the kernel may hold for as long as a lost NVMe-oF path lasts."""

    def __init__(self) -> None:
        self._idle = threading.Condition()
        self._inside = 0
        self._closed = False
        self._then: Callable[[], None] | None = None  # once closed and the last one is out

    @contextlib.contextmanager
    def reading(self) -> Iterator[bool]:
        """Yield False (do not start) once closing: the client may already see EOF."""
        with self._idle:
            closed = self._closed
            self._inside += not closed
        if closed:
            yield False
            return
        try:
            yield True
        finally:
            with self._idle:
                self._inside -= 1
                then = self._take_then()
            if then is not None:
                then()

    @property
    def closing(self) -> bool:
        """The session is closing: its client is gone, or going."""
        return self._closed

    def close(self, then: Callable[[], None]) -> bool:
        """Let no store start; call ``then`` once none is inside (now, or when the last one
        leaves, on its thread). True when it ran now."""
        with self._idle:
            self._closed = True
            self._then = then
            ready = self._take_then()
        if ready is not None:
            ready()
        return ready is not None

    def _take_then(self) -> Callable[[], None] | None:
        """Under the lock: what to run now that the readers may be done, at most once."""
        if not self._closed or self._inside or self._then is None:
            return None
        then, self._then = self._then, None
        return then
