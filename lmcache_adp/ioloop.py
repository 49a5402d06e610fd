"""The plugin's I/O thread: it alone touches the gateway link, the window and L1 buffers (with
the gateway, for zero-copy ops, under their fences). See lmcache_adp/connector.py for the
contract with LMCache it keeps, and docs/design.md ("The zero-copy fence").
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import select
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from gateway import fragmenter
from gateway.checksum import checksum
from gateway.errors import GatewayError
from gateway.protocol import (
    CHECKSUM_BYTES,
    KEY_BYTES_MAX,
    KEYS_PER_REQUEST_MAX,
    Op,
    Status,
    checksums_at,
    encode_keys,
    pack_checksums,
    unpack_checksums,
)
from gateway.ring.layout import PAGE_BYTES, Completion
from gateway.units import format_size
from lmcache_adp import config
from lmcache_adp.completions import CompletionQueue
from lmcache_adp.copier import Copier
from lmcache_adp.link import GatewayLink, Request

log = logging.getLogger("lmcache_adp")
# Keys of an EXISTS or DELETE travel in runs of at most this many msgpack bytes, which every
# gateway arena holds (session_arena_size is at least 64 KiB).
RUN_BYTES_MAX = 64 * 2**10 - 16
_KEY_OVERHEAD_BYTES = 5  # msgpack's str header
IDLE_POLL_MS = 200
FENCE_POLL_MS = 5  # how often an op past its deadline checks whether the gateway let go of L1


@dataclass
class Batch:
    future_id: int
    op: Op
    keys: list[str]
    buffers: list[memoryview] | None
    deadline_ns: int
    results: list[bool] = field(default_factory=list)
    remaining: int = 0
    failed: bool = False
    done: bool = False
    internal: bool = False  # the plugin's own op, never reported to LMCache
    waiting: bool = False  # past its deadline, while the gateway still moves one of its buffers


@dataclass
class Shared:
    """What the connector's threads share. Deques and events are thread-safe as used here."""

    params: config.ADPParams
    completions: CompletionQueue = field(default_factory=CompletionQueue)
    wake: int = field(default_factory=lambda: os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC))
    incoming: deque[Batch] = field(default_factory=deque)  # submits -> I/O thread
    new_links: deque[GatewayLink] = field(default_factory=deque)  # connect -> I/O thread
    stopping: threading.Event = field(default_factory=threading.Event)
    want_link: threading.Event = field(default_factory=threading.Event)  # I/O -> connect
    op_ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def wake_io(self) -> None:
        os.eventfd_write(self.wake, 1)


class IOLoop:
    """The plugin's one I/O thread: it alone touches the link, the window and L1 buffers
    (with the gateway, for zero-copy ops, under their fences)."""

    def __init__(self, shared: Shared) -> None:
        self._shared = shared
        self._link: GatewayLink | None = None
        self._pending: deque[Request] = deque()
        self._active: dict[int, Batch] = {}
        self._pending_store_bytes = 0  # of the SET requests in _pending
        self._shedding = False  # stores are being failed for pending_store_bytes_max
        # Links we dropped while the gateway was alive, with the zero-copy requests it may
        # still be moving: they are settled when the gateway closes its end.
        self._draining: list[tuple[GatewayLink, list[Request]]] = []
        self._copier = Copier(shared.params.copy_threads)

    def run(self) -> None:
        while not self._shared.stopping.is_set():
            self._wait()
            try:
                self._step()
            except GatewayError as exc:
                log.error("gateway link broken: %s", exc)
                self._drop_link()
            except Exception:  # a bug here must not leave LMCache's futures hanging forever
                log.exception("unexpected error in the plugin's I/O thread; failing its ops")
                self._fail_everything("an internal error")
        self._fail_everything("the plugin is closing")

    def shutdown(self) -> None:
        """After ``run``: wait (up to one op timeout) for the gateway to let go of our L1,
        then report what is left and close every link."""
        deadline = time.monotonic() + self._shared.params.op_timeout_s
        while self._draining and time.monotonic() < deadline:
            self._release_drained()
            time.sleep(FENCE_POLL_MS / 1000)
        for link, held in self._draining:
            for request in held:
                self._settle(request, Status.FAILED)
            link.close()
        self._draining.clear()
        if self._link is not None:
            self._link.close()
            self._link = None
        self._copier.close()

    def _wait(self) -> None:
        poller = select.poll()
        poller.register(self._shared.wake, select.POLLIN)
        if self._link is not None:
            poller.register(self._link.complete_fd, select.POLLIN)
            poller.register(self._link.sock_fd, select.POLLIN)
        for link, _ in self._draining:
            poller.register(link.sock_fd, select.POLLIN)
        poller.poll(self._timeout_ms())
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self._shared.wake)

    def _timeout_ms(self) -> int:
        timeout = IDLE_POLL_MS
        if any(b.waiting for b in self._active.values()):
            timeout = FENCE_POLL_MS
        deadlines = [b.deadline_ns for b in self._active.values() if not b.waiting]
        if deadlines:
            until = (min(deadlines) - time.monotonic_ns()) // 1_000_000 + 1
            timeout = max(0, min(timeout, until))
        return timeout

    def _step(self) -> None:
        shared = self._shared
        while shared.new_links:  # a newer link replaces ours without asking for yet another
            self._drop_link(reconnect=False)
            self._link = shared.new_links.popleft()
        if self._link is not None and not self._link.alive():
            log.warning("the gateway went away; ops fail until it is back")
            self._drop_link()
        self._release_drained()
        if self._link is not None:
            for completion, request in self._link.completions():
                self._finish(request, completion)
        # Each batch goes to the gateway as soon as there is room, before the next is accepted:
        # only what cannot go yet counts against pending_store_bytes_max.
        while shared.incoming:
            self._accept(shared.incoming.popleft())
            if self._link is not None:
                self._submit_pending()
        if self._link is not None:
            self._submit_pending()
        elif self._pending:
            self._fail_everything("the gateway is not connected")
        self._expire()

    def _accept(self, batch: Batch) -> None:
        requests = list(split(batch))
        self._active[batch.future_id] = batch
        params = self._shared.params
        store_bytes = sum(r.data_bytes for r in requests) if batch.op == Op.SET else 0
        if len(self._pending) + len(requests) > params.pending_ops_max:
            log.warning(
                "%d ops are waiting for the gateway; failing a new %s of %d keys",
                len(self._pending),
                batch.op.name,
                len(batch.keys),
            )
            batch.failed = True
            requests = []
        elif (
            store_bytes
            and self._pending_store_bytes
            and self._pending_store_bytes + store_bytes > params.pending_store_bytes_max
        ):
            # Shed the store now rather than hold LMCache's buffers until its deadline; LMCache
            # keeps the chunks in L1. Logged once per burst, not per batch.
            if not self._shedding:
                log.warning(
                    "stores are arriving faster than the gateway takes them; failing new ones "
                    "while %s wait (pending_store_bytes_max)",
                    format_size(self._pending_store_bytes),
                )
            self._shedding = True
            batch.failed = True
            requests = []
        self._pending_store_bytes += store_bytes if requests else 0
        batch.remaining = len(requests)
        self._pending.extend(requests)
        if batch.remaining == 0:
            self._report(batch)

    def _submit_pending(self) -> None:
        link = self._link
        assert link is not None
        submitted = False
        while self._pending:
            request = self._pending[0]
            batch: Batch = request.batch
            if batch.done:
                self._pop_pending()
                continue
            if request.data_bytes > link.welcome.object_bytes_max:
                self._pop_pending()
                self._settle(request, Status.REJECTED)
                continue
            keys = encode_keys(request.keys)
            request.l1_offset = zero_copy_offset(link, request, len(keys))
            if not link.try_reserve(request):
                break
            self._pop_pending()
            extra = b""  # a zero-copy store's checksums
            if request.op == Op.SET:
                assert batch.buffers is not None
                buffer = batch.buffers[request.first]
                if request.l1_offset is None:
                    self._copier.copy(link.extent(request), buffer)
                else:
                    extra = pack_checksums(fragment_checksums(buffer, link.welcome.fragment_bytes))
            link.submit(next(self._shared.op_ids), request, keys, batch.deadline_ns, extra)
            submitted = True
        if submitted:
            link.ring()

    def _pop_pending(self) -> Request:
        request = self._pending.popleft()
        if request.op == Op.SET:
            self._pending_store_bytes -= request.data_bytes
            self._shedding = self._shedding and bool(self._pending_store_bytes)
        return request

    def _finish(self, request: Request, completion: Completion) -> None:
        link = self._link
        assert link is not None
        batch: Batch = request.batch
        status = (
            Status(completion.status)
            if completion.status in Status._value2member_map_
            else Status.FAILED
        )
        if not batch.done:
            if status == Status.OK and request.op == Op.GET:
                assert batch.buffers is not None
                buffer = batch.buffers[request.first]
                if request.l1_offset is None:
                    self._copier.copy(buffer, link.extent(request))
                elif not self._verified(link, request, completion, buffer):
                    status = Status.MISS
            results = None
            if status == Status.OK and request.op in (Op.EXISTS, Op.DELETE):
                count = min(completion.result_bytes, len(request.keys))
                results = [b == 1 for b in bytes(link.arena(request)[:count])]
            self._settle(request, status, results)
        link.release(request)

    def _verified(
        self, link: GatewayLink, request: Request, completion: Completion, buffer: memoryview
    ) -> bool:
        """Whether a zero-copy load's bytes in L1 match the checksums the gateway read from
        disk. A mismatch is a miss, and the object is deleted (invariant 1)."""
        count = min(completion.result_bytes, link.welcome.arena_bytes) // 8
        expected = unpack_checksums(link.arena(request), count)
        if expected == fragment_checksums(buffer, link.welcome.fragment_bytes):
            return True
        log.warning("%s failed its checksum in L1; reporting a miss", request.keys[0])
        deadline_ns = time.monotonic_ns() + int(self._shared.params.op_timeout_s * 1e9)
        future_id = -next(self._shared.op_ids)  # never one of LMCache's
        self._accept(
            Batch(future_id, Op.DELETE, request.keys, None, deadline_ns, [False], internal=True)
        )
        return False

    def _settle(self, request: Request, status: Status, results: list[bool] | None = None) -> None:
        """Record a request's outcome in its batch; report the batch when it is the last one."""
        batch: Batch = request.batch
        if batch.done:
            return
        if status == Status.OK:
            values = results if results is not None else [True] * len(request.keys)
            batch.results[request.first : request.first + len(values)] = values
        elif status != Status.MISS:
            batch.failed = True
        batch.remaining -= 1
        if batch.remaining == 0:
            self._report(batch)

    def _report(self, batch: Batch) -> None:
        batch.done = True
        self._active.pop(batch.future_id, None)
        if batch.internal:
            return
        ok = not batch.failed and (batch.op != Op.SET or all(batch.results))
        error = "" if ok else f"{batch.op.name} failed for some keys"
        self._shared.completions.push(batch.future_id, ok, error, batch.results)

    def _expire(self) -> None:
        now = time.monotonic_ns()
        for batch in [b for b in self._active.values() if b.deadline_ns <= now]:
            if self._touching(batch):
                if not batch.waiting:
                    batch.waiting = True
                    log.warning(
                        "%s of %d keys passed its deadline while the gateway moves its bytes "
                        "to or from L1; it is reported when that ends",
                        batch.op.name,
                        len(batch.keys),
                    )
                continue
            log.warning(
                "%s of %d keys timed out after %.1f s",
                batch.op.name,
                len(batch.keys),
                self._shared.params.op_timeout_s,
            )
            batch.failed = True
            self._report(batch)

    def _touching(self, batch: Batch) -> bool:
        """Whether the gateway may still touch one of the batch's L1 buffers. A request once
        seen moving counts until its completion arrives: the gateway lowers the fence just
        before it posts the completion, and the answer (often a late success) is on its way."""
        link = self._link
        if link is not None:
            for request in link.inflight.values():
                if request.batch is batch and (request.moving or link.fenced(request)):
                    request.moving = True
                    return True
        return any(r.batch is batch for _, held in self._draining for r in held)

    def _drop_link(self, reconnect: bool = True) -> None:
        """Fail what is in flight on the current link and close it; by default ask for a new one.

        A gateway that is still alive may be moving zero-copy requests: those are held until it
        closes its end, which it does only once it no longer touches our L1."""
        link, self._link = self._link, None
        if link is None:
            return
        alive = link.alive()
        held = []
        for request in link.inflight.values():
            if alive and request.l1_offset is not None and not request.batch.done:
                held.append(request)
            else:
                self._settle(request, Status.FAILED)
        if held:
            link.shutdown()
            self._draining.append((link, held))
        else:
            link.close()
        if reconnect:
            self._shared.want_link.set()

    def _release_drained(self) -> None:
        for link, held in list(self._draining):
            if link.alive():
                continue
            self._draining.remove((link, held))
            for request in held:
                self._settle(request, Status.FAILED)
            link.close()

    def _fail_everything(self, why: str) -> None:
        self._drop_link()
        while self._pending:
            self._settle(self._pop_pending(), Status.FAILED)
        for batch in list(self._active.values()):
            if self._touching(batch):
                continue  # reported when the gateway lets go of its buffers
            log.debug("%s: failing future %d", why, batch.future_id)
            batch.failed = True
            self._report(batch)


def zero_copy_offset(link: GatewayLink, request: Request, keys_bytes: int) -> int | None:
    """The L1 offset of the request's buffer when it can go zero-copy on this link, else None.

    A load must fill whole pages (O_DIRECT writes them whole), and the checksums must fit the
    slot's arena."""
    segment, fragment_bytes = link.l1, link.welcome.fragment_bytes
    buffers = request.batch.buffers
    if segment is None or not fragment_bytes or buffers is None:
        return None
    buffer = buffers[request.first]
    if request.op == Op.GET and buffer.nbytes % PAGE_BYTES:
        return None
    fragments = fragmenter.count(buffer.nbytes, fragment_bytes)
    if checksums_at(keys_bytes) + CHECKSUM_BYTES * fragments > link.welcome.arena_bytes:
        return None
    return segment.offset_of(buffer)


def fragment_checksums(buffer: memoryview, fragment_bytes: int) -> list[int]:
    """The payload checksum of each fragment the gateway stores ``buffer`` as."""
    return [
        checksum(buffer[f.offset : f.offset + f.length])
        for f in fragmenter.plan(buffer.nbytes, fragment_bytes, 1, 0)
    ]


def split(batch: Batch) -> Iterator[Request]:
    """Ring requests for a batch: one per object, or runs of keys that fit an arena.

    A key longer than the protocol allows is left out: it stays a miss (False).
    """
    if batch.buffers is not None:
        for i, (key, buf) in enumerate(zip(batch.keys, batch.buffers, strict=True)):
            if len(key.encode()) <= KEY_BYTES_MAX:
                yield Request(batch.op, [key], i, batch, data_bytes=buf.nbytes)
        return
    run: list[str] = []
    run_bytes = first = 0
    for i, key in enumerate(batch.keys):
        key_bytes = len(key.encode()) + _KEY_OVERHEAD_BYTES
        full = run_bytes + key_bytes > RUN_BYTES_MAX or len(run) == KEYS_PER_REQUEST_MAX
        if run and (full or key_bytes > KEY_BYTES_MAX + _KEY_OVERHEAD_BYTES):
            yield Request(batch.op, run, first, batch)
            run, run_bytes = [], 0
        if key_bytes > KEY_BYTES_MAX + _KEY_OVERHEAD_BYTES:
            continue
        if not run:
            first = i
        run.append(key)
        run_bytes += key_bytes
    if run:
        yield Request(batch.op, run, first, batch)
