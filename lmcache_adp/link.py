"""The plugin's side of one gateway session: handshake, shared memory, slots and window.

A ``GatewayLink`` is used by the connector's I/O thread only (not thread-safe). When the gateway
dies the link is dropped whole and a new one is made by a new handshake.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np

from adp_wire.errors import ProtocolError
from adp_wire.presence import PresenceView
from adp_wire.protocol import (
    ARENA_BYTES_MIN,
    GIVEN_UP_BYTES,
    Hello,
    Op,
    Welcome,
    connect_within,
    given_up_span,
    hello_body,
    parse_welcome,
    recv_frame,
    send_frame,
    source_span,
)
from adp_wire.ring import doorbell
from adp_wire.ring.layout import (
    FLAG_L1,
    FLAG_REMOTE,
    LOOKUPS,
    PAGE_BYTES,
    UNTAKEN,
    Completion,
    RingLayout,
    Submission,
    align_up,
    map_shared,
)
from adp_wire.ring.queue import check_host, completion_consumer, submission_producer
from lmcache_adp import remote_copy, trust
from lmcache_adp.batch import Batch
from lmcache_adp.l1_segment import L1Map, address_of
from lmcache_adp.lookups import LocalLookups
from lmcache_adp.window import WindowAllocator


@dataclass(eq=False)
class Request:
    """One ring op: a single object (GET/SET) or a run of keys (EXISTS/DELETE)."""

    op: Op
    keys: list[str]
    first: int  # index in its batch of keys[0]
    batch: Batch  # the LMCache call this request is part of
    data_bytes: int = 0
    payload: bytes = b""  # its keys, encoded for the slot's arena
    slot: int = -1
    data_offset: int = -1  # into the window; or into the L1 segment when l1_offset is set
    l1_offset: int | None = None  # a zero-copy store: the buffer's offset in the L1 segment
    source: int | None = None  # a remote-copy store: the buffer's address in this process
    link: GatewayLink | None = None  # the link holding its slot, from reserve to release
    prepared: bool | None = None  # a store ready to post: whether its copy succeeded


class GatewayLink:
    def __init__(self, sock: socket.socket, welcome: Welcome, fds: list[int]) -> None:
        """Takes over ``fds`` (memfd, submit and complete doorbells, and the presence table's
        when the welcome has one); closes them if it fails."""
        memfd, self.submit_doorbell, self.complete_doorbell = fds[:3]
        self.welcome = welcome
        self._sock = sock
        self.lookups: LocalLookups | None = None  # answers EXISTS without the gateway
        try:
            try:
                if welcome.arena_bytes < ARENA_BYTES_MIN:
                    raise ProtocolError(
                        f"the welcome's arenas of {welcome.arena_bytes} bytes are smaller than "
                        f"the protocol's {ARENA_BYTES_MIN}"
                    )
                self.layout = RingLayout(welcome.slots, welcome.arena_bytes, welcome.window_bytes)
                self._mapping = map_shared(memfd, self.layout)
            finally:
                os.close(memfd)
            doorbell.check(self.submit_doorbell, "the submission doorbell")
            doorbell.check(self.complete_doorbell, "the completion doorbell")
            self.memory = memoryview(self._mapping)
            self.window = self.layout.window(self.memory)
            # The plugin's count of the stores it did not take, which the gateway reads.
            self.untaken = np.frombuffer(self.memory, np.uint64, 2, UNTAKEN)
            self._submissions = submission_producer(self.memory, self.layout)
            self._completions = completion_consumer(self.memory, self.layout)
            if welcome.presence_slots:
                view = PresenceView(fds[3], welcome.presence_slots)
                counts = np.frombuffer(self.memory, np.uint64, 2, LOOKUPS)
                self.lookups = LocalLookups(view, counts)
        except BaseException as exc:  # a welcome that maps badly: whatever it was, not ours
            os.close(self.submit_doorbell)
            os.close(self.complete_doorbell)
            if isinstance(exc, Exception) and not isinstance(exc, ProtocolError):
                raise ProtocolError(f"the gateway's shared memory does not map: {exc}") from exc
            raise
        finally:
            for fd in fds[3:]:  # the presence table's: its mapping keeps the table
                os.close(fd)
        self.l1: L1Map | None = None  # set by connect when the gateway took our L1 segment
        self.remote = bool(welcome.remote_copy)  # the gateway copies stores out of our memory
        self._free_slots = list(range(welcome.slots - 1, -1, -1))
        self.allocator = WindowAllocator(welcome.window_bytes)
        self.inflight: dict[int, Request] = {}  # op_id -> request
        self._held_slots: Counter[Op] = Counter()  # from reserve to release, by op
        self._held_bytes: Counter[Op] = Counter()  # of the window, likewise

    @classmethod
    def connect(
        cls,
        path: str,
        hello: Hello,
        timeout_s: float,
        trusted: frozenset[int],
        l1: L1Map | None = None,
        probe: remote_copy.Probe | None = None,
    ) -> GatewayLink:
        """Handshake with the gateway at ``path``, once it proves to be a trusted user's
        (lmcache_adp/trust.py; nothing is sent before); with ``l1``, offer it a read-only fd of
        our L1 segment for zero-copy stores, or else with ``probe`` let it copy stores out of
        our memory (lmcache_adp/remote_copy.py). Raises UntrustedGateway, HandshakeRefused,
        ProtocolError or OSError."""
        check_host()
        trust.check_socket_directory(path, trusted)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        deadline = time.monotonic() + timeout_s  # for the whole handshake, however paced
        try:
            sock.settimeout(timeout_s)
            connect_within(sock, path, deadline)
            gateway_pid = trust.check_peer(sock, path, trusted)
            if l1 is None:
                if probe is not None:
                    remote_copy.let_read_by(gateway_pid)
                    hello = replace(hello, remote_probe=probe.address, remote_token=probe.token)
                send_frame(sock, hello_body(hello), deadline=deadline)
            else:
                segment = l1.open()
                try:
                    body = hello_body(replace(hello, l1_bytes=l1.size))
                    send_frame(sock, body, [segment], deadline)
                finally:
                    os.close(segment)
            body, fds = recv_frame(sock, fds_max=4, deadline=deadline)
            try:
                welcome = parse_welcome(body)
                expected = 4 if welcome.presence_slots else 3
                if len(fds) != expected:
                    raise ProtocolError(
                        f"the gateway sent {len(fds)} fds with its welcome, not {expected}"
                    )
            except BaseException:
                for fd in fds:
                    os.close(fd)
                raise
            sock.settimeout(None)
            link = cls(sock, welcome, fds)
            link.l1 = l1 if welcome.l1_attached else None
            return link
        except BaseException:
            sock.close()
            raise

    @property
    def sock_fd(self) -> int:
        return self._sock.fileno()

    def alive(self) -> bool:
        """False once the gateway closed its end (it died or dropped us). Raises ProtocolError
        if it sent bytes: it sends none after the welcome, and bytes left unread would wake
        the I/O thread's poll at once, for ever."""
        try:
            peeked = self._sock.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if peeked:
            raise ProtocolError("the gateway sent bytes after its welcome")
        return False

    def try_reserve(
        self, request: Request, slots_max: int, window_bytes_max: int, slots_kept: int = 0
    ) -> bool:
        """Take a slot (and a window extent for a GET or a SET that is not zero-copy), as long
        as requests of its op then hold at most ``slots_max`` slots and ``window_bytes_max``
        bytes of the window (one object always may, so no object is too large to ever go),
        and ``slots_kept`` slots stay free (lookups' share); False when there is no room."""
        op = request.op
        if len(self._free_slots) <= slots_kept or self._held_slots[op] >= slots_max:
            return False
        data_bytes = 0
        if request.l1_offset is not None:
            request.data_offset = request.l1_offset
        elif op in (Op.GET, Op.SET):
            data_bytes = align_up(max(request.data_bytes, 1))
            if self._held_bytes[op] and self._held_bytes[op] + data_bytes > window_bytes_max:
                return False
            offset = self.allocator.allocate(request.data_bytes)
            if offset is None:
                return False
            request.data_offset = offset
        request.slot = self._free_slots.pop()
        request.link = self
        self._held_slots[op] += 1
        self._held_bytes[op] += data_bytes
        return True

    def place_store(self, request: Request) -> None:
        """Decide how the gateway reads a store: straight from our L1 segment (zero-copy:
        ``l1_offset``), out of our memory into the window (remote copy: ``source``), or from
        the window once our copier has filled it (neither)."""
        buffers = request.batch.buffers
        assert buffers is not None
        request.l1_offset = request.source = None
        if source_span(len(request.payload)).stop > self.welcome.arena_bytes:
            return  # no room for the given-up word and the address in the slot's arena
        buffer = buffers[request.first]
        if self.l1 is not None and not buffer.nbytes % PAGE_BYTES:
            # Only objects of whole pages: no byte of L1 beyond the object reaches the disk.
            request.l1_offset = self.l1.offset_of(buffer)
        if request.l1_offset is None and self.remote and buffer.nbytes:
            request.source = address_of(buffer)

    def reads_l1(self, request: Request) -> bool:
        """Whether the gateway reads this request's buffer in L1 itself."""
        return request.l1_offset is not None or request.source is not None

    def extent(self, request: Request) -> memoryview:
        return self.window[request.data_offset : request.data_offset + request.data_bytes]

    def arena(self, request: Request) -> memoryview:
        return self.layout.arena(self.memory, request.slot)

    def submit(self, op_id: int, request: Request, payload: bytes, deadline_ns: int) -> None:
        """Post ``request``: its keys (``payload``) in its arena, and for a store the gateway
        reads from L1 its given-up word, clear (and a remote copy's buffer address)."""
        arena = self.arena(request)
        arena[: len(payload)] = payload
        flags = 0
        if self.reads_l1(request):
            arena[given_up_span(len(payload))] = bytes(GIVEN_UP_BYTES)
            flags = FLAG_L1 if request.l1_offset is not None else FLAG_REMOTE
        if request.source is not None:
            arena[source_span(len(payload))] = request.source.to_bytes(8, "little")
        entry = Submission(
            op_id,
            request.op,
            flags,
            0,
            request.slot,
            len(payload),
            0,
            deadline_ns,
            max(request.data_offset, 0),
            request.data_bytes,
        )
        # The queue has an entry for every slot, so only a gateway that does not take its
        # submissions fills it: a broken link, not a bug of ours.
        if not self._submissions.push(entry):
            raise ProtocolError("the gateway's submission queue is full: it takes no submissions")
        self.inflight[op_id] = request

    def ring(self) -> None:
        doorbell.ring(self.submit_doorbell)

    def completions(self) -> Iterator[tuple[Completion, Request]]:
        """The ops the gateway completed, each with its request (out of ``inflight``). Raises
        ProtocolError, once the others are yielded, for a completion of no op in flight."""
        doorbell.answer(self.complete_doorbell)
        unknown = []
        for completion in self._completions.pop_all():
            request = self.inflight.get(completion.op_id)
            if request is None or request.slot != completion.slot:
                unknown.append(completion.op_id)
                continue
            del self.inflight[completion.op_id]
            yield completion, request
        if unknown:
            raise ProtocolError(f"completions for unknown ops {unknown}")

    def give_up(self, request: Request) -> None:
        """Before a store the gateway reads from L1 is reported failed: tell the gateway,
        through its given-up word, that LMCache may rewrite the buffer from now on
        (adp_wire/protocol.py)."""
        if self.reads_l1(request) and request.link is self:
            self.arena(request)[given_up_span(len(request.payload))] = b"\xff" * GIVEN_UP_BYTES

    def release(self, request: Request) -> None:
        """Give back the request's slot and extent (only once neither the gateway nor a copy
        uses them any more)."""
        assert request.link is self
        request.link = None
        self._free_slots.append(request.slot)
        self._held_slots[request.op] -= 1
        if request.data_offset >= 0 and request.l1_offset is None:
            self.allocator.release(request.data_offset, request.data_bytes)
            self._held_bytes[request.op] -= align_up(max(request.data_bytes, 1))

    def wait_closed(self, timeout_s: float) -> bool:
        """After ``shutdown``: wait up to ``timeout_s`` for the gateway's EOF, which it sends
        only once no zero-copy store of ours is reading L1; True when it came."""
        deadline = time.monotonic() + timeout_s
        poller = select.poll()  # select() refuses fd numbers of 1024 and up
        poller.register(self._sock, select.POLLIN)
        try:
            while self.alive():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                poller.poll(remaining * 1000)
        except ProtocolError:
            return False
        return True

    def shutdown(self) -> None:
        """Tell the gateway we are gone; it closes its end once it no longer touches our L1."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._sock.close()
        os.close(self.submit_doorbell)
        os.close(self.complete_doorbell)
