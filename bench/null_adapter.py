"""A floor for lookups under load: an L2 adapter that costs LMCache nothing.

``NullConnector`` is a native_plugin (the same seven methods as ``ADPConnector``) that keeps no
bytes and does no I/O: a store completes, successfully, after the time a disk of
``store_gbps`` would take to write it, without reading its buffers; EXISTS answers at once from a
set of the keys stored; loads miss. Driven through a real ``lmcache server``, it shows how much a
lookup slows down while LMCache itself writes a prompt through to L2 (its own GPU or CPU copies,
its store controller, the client's traffic), whatever the tier under it: what is left for any
adapter to remove. bench/lookup_under_load.py runs it as the ``null`` contender.

    --l2-adapter '{"type":"native_plugin","module_path":"bench.null_adapter",
                   "class_name":"NullConnector","adapter_params":{"store_gbps":1.5}}'

With ``copy: true`` (the ``null_copy`` contender) it also reads each store's buffers as our
plugin's copy path does: the plugin's own ``Copier`` copies them, in the same slices on as many
threads as the plugin takes by default (``copy_threads`` in lmcache_adp/config.py), into a
scratch ring the size of a session's window, and a store completes no sooner than its copy. That
isolates what reading L1 inside LMCache's process costs LMCache's lookups from everything else
our plugin and gateway do.

With ``copy: "process"`` (the ``null_copy_process`` contender) the same bytes are copied, with
the same slices and threads, by another process between two scratch rings of its own (L1 is
private to LMCache's process): LMCache's process then does no copy at all, while the host's
memory system and cores carry the same traffic. If lookups slow down as much as with ``copy:
true``, the tail is the host's, and moving the copy out of LMCache's process (a gateway reading
L1 itself) would not remove it.

With ``copy: "checksum"`` (the ``null_checksum`` contender) it reads each store's buffers once,
as our plugin's zero-copy stores did up to protocol 4: the payload checksum of each fragment (the
gateway's default fragment size), one job per fragment on as many threads as the plugin's copy
threads, and nothing is copied. That is the least per-byte work an adapter that checks what it
stores does inside LMCache's process. ``copy: "process-checksum"`` (the
``null_checksum_process`` contender) has another process take as many checksums, the same way:
what a gateway that checks L1 itself (protocol 5) costs LMCache's lookups.

With ``copy: "process-write"`` (the ``null_write_process`` contender) another process writes as
many bytes to a file in ``write_dir`` with O_DIRECT, a fragment per write, ``WRITE_THREADS`` at a
time, and a store completes no sooner than its writes: the disk traffic of an adapter that
persists what it stores, none of its work in LMCache's process. It is the floor for any such
adapter on a host whose disk traffic itself slows other work (a VM's virtio disk).

With ``copy: "process-persist"`` (the ``null_persist_process`` contender) another process
does both, fragment by fragment: the checksum of as many bytes, then their O_DIRECT write. That
is the least an adapter that persists and checks what it stores, none of it in LMCache's
process, costs LMCache's lookups on the host: the floor for our zero-copy stores.

    python -m bench.null_adapter copy-worker THREADS [checksum|write DIR|persist DIR]
    # "id sizes" lines in, each id out once its work is done
"""

from __future__ import annotations

import functools
import heapq
import itertools
import mmap
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import numpy as np

from adp_gateway.config import GatewayConfig
from adp_wire import fragmenter
from adp_wire.checksum import checksum
from adp_wire.ring.layout import align_up
from lmcache_adp import config
from lmcache_adp.completions import Completion, CompletionQueue
from lmcache_adp.copier import Copier
from lmcache_adp.workers import Workers

SCRATCH_BYTES = 512 * 2**20  # the gateway's default session window
WRITE_THREADS = 8  # the gateway's default io_threads
WRITE_FILE_BYTES = 2**30  # the writes go round this file, written once before the first


class NullConnector:
    def __init__(
        self, store_gbps: float = 1.5, copy: bool | str = False, write_dir: str = "", **_: object
    ) -> None:
        self._bytes_per_s = float(store_gbps) * 1e9
        threads = config.copy_threads(config.parse({}))
        self._copier = Copier(threads) if copy is True else None
        self._checksums = _Checksums(threads) if copy == "checksum" else None
        work = {
            "process": ["copy"],
            "process-checksum": ["checksum"],
            "process-write": ["write", write_dir],
            "process-persist": ["persist", write_dir],
        }
        elsewhere = work.get(str(copy))
        self._elsewhere = _CopyElsewhere(threads, elsewhere, self._copied) if elsewhere else None
        self._scratch = _Ring(np.empty(SCRATCH_BYTES if self._copier else 0, np.uint8).data)
        self._copying: dict[int, int] = {}  # future id -> buffers still being copied
        self._completions = CompletionQueue()
        self._future_ids = itertools.count(1)
        self._stored: set[str] = set()
        self._due: list[tuple[float, int, list[str]]] = []  # heap of stores still "writing"
        self._disk_free_at = 0.0  # the simulated disk writes one store after another
        self._wake = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._complete_stores, name="null-l2", daemon=True)
        self._thread.start()

    def event_fd(self) -> int:
        return self._completions.fd

    def submit_batch_set(self, keys: list[str], memviews: list[memoryview]) -> int:
        future_id = next(self._future_ids)
        nbytes = sum(m.nbytes for m in memviews)
        with self._wake:
            start = max(time.monotonic(), self._disk_free_at)
            self._disk_free_at = start + nbytes / self._bytes_per_s
            heapq.heappush(self._due, (self._disk_free_at, future_id, list(map(str, keys))))
            if self._copier or self._checksums or self._elsewhere:
                self._copying[future_id] = len(memviews)
            self._wake.notify()
        if self._copier is not None:
            for memview in memviews:
                self._copy(future_id, memview.cast("B"))
        elif self._checksums is not None:
            for memview in memviews:
                self._checksums.take(memview.cast("B"), functools.partial(self._copied, future_id))
        elif self._elsewhere is not None:
            self._elsewhere.copy(future_id, [memview.nbytes for memview in memviews])
        return future_id

    def _copied(self, future_id: int) -> None:
        with self._wake:
            self._copying[future_id] -= 1
            self._wake.notify()

    def _copy(self, future_id: int, source: memoryview) -> None:
        """Copy one buffer into the scratch ring (the plugin's Copier, as on its copy path)."""
        assert self._copier is not None
        destination = self._scratch.take(source.nbytes)
        source = source[: destination.nbytes]
        self._copier.copy(destination, source, lambda ok: self._copied(future_id))

    def submit_batch_get(self, keys: list[str], memviews: list[memoryview]) -> int:
        return self._answer([False] * len(keys))

    def submit_batch_exists(self, keys: list[str]) -> int:
        with self._wake:
            found = [str(key) in self._stored for key in keys]
        return self._answer(found)

    def submit_batch_delete(self, keys: list[str]) -> int:
        with self._wake:
            found = [str(key) in self._stored for key in keys]
            self._stored.difference_update(map(str, keys))
        return self._answer(found)

    def drain_completions(self) -> list[Completion]:
        return self._completions.drain()

    def close(self) -> None:
        with self._wake:
            self._closing = True
            self._wake.notify()
        self._thread.join()
        if self._copier is not None:
            self._copier.close()
        if self._checksums is not None:
            self._checksums.close()
        if self._elsewhere is not None:
            self._elsewhere.close()
        self._completions.close()

    def _answer(self, per_key: list[bool]) -> int:
        future_id = next(self._future_ids)
        self._completions.push(future_id, True, "", per_key)
        return future_id

    def _complete_stores(self) -> None:
        with self._wake:
            while not self._closing:
                if not self._due:
                    self._wake.wait()
                    continue
                due_at, future_id, keys = self._due[0]
                if self._copying.get(future_id, 0) > 0:  # its copy is still running
                    self._wake.wait()
                    continue
                self._copying.pop(future_id, None)
                if (wait_s := due_at - time.monotonic()) > 0:
                    self._wake.wait(wait_s)
                    continue
                heapq.heappop(self._due)
                self._stored.update(keys)
                self._completions.push(future_id, True, "", [True] * len(keys))
            for _, future_id, keys in self._due:  # closing: what was still "writing" failed
                self._completions.push(future_id, False, "closed", [False] * len(keys))


class _Ring:
    """Scratch memory handed out in turn: each ``take`` is the next ``size`` bytes (at most the
    whole ring), from the start again when the end is too near."""

    def __init__(self, memory: memoryview) -> None:
        self._memory = memory
        self._at = 0

    def take(self, size: int) -> memoryview:
        size = min(size, len(self._memory))
        if self._at + size > len(self._memory):
            self._at = 0
        self._at += size
        return self._memory[self._at - size : self._at]


class _CopyElsewhere:
    """Another process that copies as many bytes as each of a store's buffers has, and says when
    each copy is done."""

    def __init__(self, threads: int, work: list[str], copied: Callable[[int], None]) -> None:
        argv = [sys.executable, "-m", "bench.null_adapter", "copy-worker", str(threads), *work]
        self._worker = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        self._lock = threading.Lock()
        self._copied = copied
        self._reader = threading.Thread(target=self._read, name="null-copy-acks", daemon=True)
        self._reader.start()

    def copy(self, future_id: int, sizes: list[int]) -> None:
        assert self._worker.stdin is not None
        with self._lock:
            self._worker.stdin.write(f"{future_id} {' '.join(map(str, sizes))}\n")

    def close(self) -> None:
        assert self._worker.stdin is not None
        self._worker.stdin.close()
        self._worker.wait(30)

    def _read(self) -> None:
        assert self._worker.stdout is not None
        for line in self._worker.stdout:
            self._copied(int(line))


class _Checksums:
    """The payload checksum of each fragment of a buffer, one job per fragment on a pool of
    threads (the plugin's own, lmcache_adp/workers.py), as the plugin took them for a zero-copy
    store up to protocol 4."""

    def __init__(self, threads: int) -> None:
        self._pool = Workers(threads, "null-checksums")
        self._fragment_bytes = GatewayConfig().fragment_size

    def take(self, buffer: memoryview, done: Callable[[], None]) -> None:
        """Checksum every fragment of ``buffer``, then ``done()`` on the last one's thread."""
        plan = fragmenter.plan(buffer.nbytes, self._fragment_bytes, 1, 0)
        one_done = _last_calls(len(plan), done)

        def one(offset: int, length: int) -> None:
            checksum(buffer[offset : offset + length])
            one_done()

        for f in plan:
            self._pool.submit(functools.partial(one, f.offset, f.length))

    def close(self) -> None:
        self._pool.close()


class _Writes:
    """Writes of as many bytes as a buffer has, fragment by fragment, with O_DIRECT, from one
    page-aligned block of memory to the next place in a file that was written once."""

    def __init__(self, directory: str) -> None:
        self._pool = Workers(WRITE_THREADS, "null-writes")
        self._fragment_bytes = GatewayConfig().fragment_size
        self._memory = mmap.mmap(-1, self._fragment_bytes)
        self._memory.write(b"\x01" * self._fragment_bytes)
        path = os.path.join(directory, "null-writes")
        with open(path, "wb") as f:  # written once, so no write below converts an extent
            for _ in range(WRITE_FILE_BYTES // self._fragment_bytes):
                f.write(self._memory)
        self._fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
        self._offset = 0
        self._lock = threading.Lock()

    def take(self, nbytes: int, done: Callable[[], None]) -> None:
        """Write ``nbytes`` (whole 4 KiB pages), then ``done()`` on the last write's thread."""
        plan = fragmenter.plan(nbytes, self._fragment_bytes, 1, 0)
        one_done = _last_calls(len(plan), done)

        def one(length: int) -> None:
            length = align_up(length)
            with self._lock:
                if self._offset + length > WRITE_FILE_BYTES:
                    self._offset = 0
                offset, self._offset = self._offset, self._offset + length
            os.pwrite(self._fd, memoryview(self._memory)[:length], offset)
            one_done()

        for f in plan:
            self._pool.submit(functools.partial(one, f.length))

    def close(self) -> None:
        self._pool.close()
        os.close(self._fd)


def _last_calls(count: int, done: Callable[[], None]) -> Callable[[], None]:
    """A function to call once per part, from any thread: the ``count``-th call calls ``done``."""
    left = [count]
    lock = threading.Lock()

    def one_done() -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            done()

    return one_done


def copy_worker(threads: int, work: str = "copy", write_dir: str = "") -> None:
    """The other process: for each "id size size..." line, one copy per size between its own
    rings (1 GiB into 512 MiB, so the bytes come from memory, not the cache), as ``_copy`` makes
    them in LMCache's process; with ``work`` "checksum" the fragments' checksums of as many
    bytes of the 1 GiB ring, with "write" as many bytes written to ``write_dir``'s disk, with
    "persist" both, each fragment's checksum before its write; prints the id as each one ends."""
    source = _Ring(np.ones(2 * SCRATCH_BYTES, np.uint8).data)
    scratch = _Ring(np.ones(SCRATCH_BYTES, np.uint8).data)
    copier = Copier(threads)
    checksums = _Checksums(threads)
    writes = _Writes(write_dir) if work in ("write", "persist") else None
    printing = threading.Lock()

    def copied(future_id: int, ok: bool) -> None:
        with printing:
            sys.stdout.write(f"{future_id}\n")
            sys.stdout.flush()

    for line in sys.stdin:
        future_id, *sizes = map(int, line.split())
        for size in sizes:
            if work == "checksum":
                checksums.take(source.take(size), functools.partial(copied, future_id, True))
                continue
            if work == "persist":
                assert writes is not None
                written = functools.partial(copied, future_id, True)
                checksums.take(source.take(size), functools.partial(writes.take, size, written))
                continue
            if writes is not None:
                writes.take(size, functools.partial(copied, future_id, True))
                continue
            destination = scratch.take(size)
            part = source.take(destination.nbytes)
            copier.copy(destination, part, functools.partial(copied, future_id))
    copier.close()
    checksums.close()
    if writes is not None:
        writes.close()


if __name__ == "__main__" and sys.argv[1:2] == ["copy-worker"]:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server's Ctrl-C; it ends with stdin
    copy_worker(int(sys.argv[2]), *sys.argv[3:5])
