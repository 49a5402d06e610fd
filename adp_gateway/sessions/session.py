"""One connected plugin instance: its shared memory, its rings and the ops it has in flight.

Everything the client writes into shared memory is untrusted. A descriptor that breaks the
protocol (unknown op, slot out of range or already in flight, a window range outside the window,
malformed keys) drops this session with a log line; other sessions are not affected.

Threads: ``run`` (the session's own thread) reads submissions and answers EXISTS from the index;
the I/O threads run its loads, stores and deletes (work.py) and call ``complete``. The mapping
stays alive until the last I/O thread has released its views of it, so a dead client never pulls
memory out from under an in-flight read or write.

Zero-copy stores (``FLAG_L1``) read the client's L1 pages, and remote-copy stores (``FLAG_REMOTE``)
its private memory, through the kernel only, inside the session's ``L1Readers``
(adp_gateway/sessions/client_l1.py), which it closes before its socket. The gateway never writes L1:
every load
lands in the window.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from adp_gateway.errors import ProtocolError
from adp_gateway.objects.store import ObjectStore
from adp_gateway.observe.metrics import Metrics
from adp_gateway.scheduling.loads import Load, groups
from adp_gateway.scheduling.scheduler import Scheduler
from adp_gateway.scheduling.tasks import SessionWork, results
from adp_gateway.sessions.client_l1 import L1Readers, L1Segment
from adp_gateway.sessions.client_process import ClientProcess
from adp_gateway.sessions.extents import (
    L1Object,
    RemoteObject,
    given_up_word,
    l1_pages,
    source_address,
    window_range,
)
from adp_gateway.sessions.presence import Presence
from adp_gateway.sessions.summary import Summary
from adp_wire.protocol import (
    GIVEN_UP_BYTES,
    KEYS_PER_REQUEST_MAX,
    Op,
    Status,
    Welcome,
    decode_keys,
)
from adp_wire.ring import doorbell
from adp_wire.ring.layout import (
    FLAG_L1,
    FLAG_REMOTE,
    LOOKUPS,
    UNTAKEN,
    Completion,
    RingLayout,
    Submission,
    create_shared,
)
from adp_wire.ring.queue import completion_producer, submission_consumer
from adp_wire.trace import Stage, mark

log = logging.getLogger(__name__)
_CLEAR = bytes(GIVEN_UP_BYTES)  # a zero-copy store's given-up word while the client wants it


class Session:
    def __init__(
        self,
        session_id: int,
        sock: socket.socket,
        tenant: str,
        peer: str,
        layout: RingLayout,
        store: ObjectStore,
        scheduler: Scheduler,
        on_close: Callable[[Session], None],
        metrics: Metrics,
        l1: L1Segment | None = None,
        presence: Presence | None = None,
        remote: ClientProcess | None = None,
    ) -> None:
        """``presence``: the tables of which a read-only fd of the tenant's goes to the client
        with the welcome, so that it answers lookups itself. ``l1``: the client's L1 segment,
        mapped for zero-copy stores; ``remote``: its process, read for remote-copy stores."""
        self.session_id = session_id
        self.tenant = tenant
        self.name = f"session {session_id} ({peer}, tenant {tenant!r})"
        self._sock = sock
        self._layout = layout
        self._store = store
        self._scheduler = scheduler
        self._on_close = on_close
        # What the session makes for its client, given back if making the rest fails (out of
        # fds: a refused client must not leave them behind).
        with contextlib.ExitStack() as made:
            self._memfd, mapping = create_shared(layout)
            made.callback(os.close, self._memfd)
            self._presence = presence
            self._presence_fd, self._presence_slots = (-1, 0)
            if presence is not None:
                self._presence_fd, self._presence_slots = presence.share(tenant)
                made.callback(presence.release, tenant)
                made.callback(os.close, self._presence_fd)
            self._submit_doorbell = doorbell.new()
            made.callback(os.close, self._submit_doorbell)
            self._complete_doorbell = doorbell.new()
            made.pop_all()
        self._memory = memoryview(mapping)
        self._window = layout.window(self._memory)
        self._lookups = np.frombuffer(self._memory, np.uint64, 2, LOOKUPS)  # the client's counts
        self._untaken = np.frombuffer(self._memory, np.uint64, 2, UNTAKEN)  # likewise
        self._l1 = l1
        self._remote = remote
        self._l1_readers = L1Readers()
        self._submissions = submission_consumer(self._memory, layout)
        self._completions = completion_producer(self._memory, layout)
        self._backlog: deque[Completion] = deque()  # completions waiting for room in the CQ
        # slot -> (op id, arrival, keys) of the op that holds it: a completion is pushed only
        # for the op in flight on its slot, so once per op, whatever path completes it.
        self._inflight: dict[int, tuple[int, float, int]] = {}
        self._metrics = metrics
        self._lock = threading.Lock()
        # Threads ringing the complete doorbell now: they ring outside the lock (a system call
        # there made every I/O thread queue behind the one waiting for the GIL to go on), so
        # the doorbell is closed by whoever leaves it last, close() or the last of them.
        self._ringing = 0
        self._closed = False
        self._summary = Summary()  # logged when the session ends
        self._work = SessionWork(
            session_id,
            tenant,
            self.name,
            store,
            scheduler,
            metrics,
            self._summary,
            self.complete,
            self._l1_readers,
        )

    @property
    def object_bytes_max(self) -> int:
        """The largest object the client may store or load: a load lands in the window."""
        return self._layout.window_bytes

    def welcome(self) -> tuple[Welcome, list[int]]:
        welcome = Welcome(
            session_id=self.session_id,
            slots=self._layout.slots,
            arena_bytes=self._layout.arena_bytes,
            window_bytes=self._layout.window_bytes,
            object_bytes_max=self.object_bytes_max,
            l1_attached=int(self._l1 is not None),
            presence_slots=self._presence_slots,
            remote_copy=int(self._remote is not None),
        )
        fds = [self._memfd, self._submit_doorbell, self._complete_doorbell]
        return welcome, [*fds, self._presence_fd] if self._presence_slots else fds

    def run(self) -> None:
        self._close_memfd()  # the client holds its own copy now; the mapping keeps ours alive
        poller = select.poll()
        poller.register(self._submit_doorbell, select.POLLIN)
        poller.register(self._sock, select.POLLIN)
        try:
            while not self._closed:
                events = dict(poller.poll(1000))
                if self._sock.fileno() in events and not self._client_alive():
                    log.info("%s: client disconnected", self.name)
                    break
                if self._submit_doorbell in events:
                    doorbell.answer(self._submit_doorbell)
                    self.dispatch(self._submissions.pop_all())
        except ProtocolError as exc:
            log.error("%s: %s; dropping the session", self.name, exc)
        finally:
            self.close()

    def fold_client_counts(self) -> None:
        """Count what the client counted in the shared memory since the last call: the
        lookups it answered from the presence table, and the stores it did not take. Counts
        that make no sense are not counted."""
        keys, found = (int(count) for count in self._lookups)
        new = self._summary.fold_lookups(keys, found)
        if new is not None:
            self._metrics.looked_up(self.tenant, *new)
        stores, nbytes = (int(count) for count in self._untaken)
        untaken = self._summary.fold_untaken(stores, nbytes)
        if untaken is not None:
            self._metrics.untaken(self.tenant, *untaken)

    def close(self, started: bool = True) -> None:
        """Free everything the session holds; ``started=False`` for one whose handshake
        failed after it was made (nothing to report: no summary line)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.fold_client_counts()
        self._close_memfd()
        if self._presence is not None:
            self._presence.release(self.tenant)
        self._scheduler.drop_session(self.session_id)
        # EOF tells the client the gateway has let go of its L1: the socket closes once no
        # zero-copy or remote-copy store reads it, which may be after this session is gone (a
        # write stuck in the kernel); the session does not wait for it.
        if not self._l1_readers.close(self._let_go_of_client):
            log.warning(
                "%s: a store is still being read from the client's L1; its "
                "socket closes once the kernel has finished with it",
                self.name,
            )
        os.close(self._submit_doorbell)
        with self._lock:
            self._close_complete_doorbell()
        if started:
            log.info("%s closed: %s", self.name, self._summary.describe())
        # Dropping the work breaks the cycle self -> work -> self.complete, so the mapping is
        # freed as soon as the last queued task lets go of it, not at the collector's next pass.
        del self._work
        self._on_close(self)

    def _let_go_of_client(self) -> None:
        """No store reads the client's L1 any more: unmap it (or let go of its process),
        close the socket."""
        if self._l1 is not None:
            self._l1.close()
        if self._remote is not None:
            self._remote.close()
        self._sock.close()

    def _close_memfd(self) -> None:
        """Close the fds only the handshake needed (the ring's memfd, the presence table's)."""
        with self._lock:
            fds = self._memfd, self._presence_fd
            self._memfd = self._presence_fd = -1
        for fd in fds:
            if fd >= 0:
                os.close(fd)

    def stop(self) -> None:
        """Ask ``run`` to end (any thread); it closes the session on its way out."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def complete(
        self,
        submission: Submission,
        status: Status,
        result_bytes: int = 0,
        data_bytes: int = 0,
        hits: int = 1,
    ) -> None:
        """Report an op done (any thread): ``hits`` of its keys found (lookups, deletes).
        Dropped silently once the session is closed, and when the op was reported already
        (a task that failed after completing some of its ops, then cancelled them all): the
        client must see each op's completion once, or it drops the whole session."""
        completion = Completion(
            submission.op_id, submission.slot, status, 0, 0, result_bytes, 0, data_bytes
        )
        with self._lock:
            if self._closed:
                return
            holder = self._inflight.get(submission.slot)
            if holder is None or holder[0] != submission.op_id:
                log.debug("%s: op %d was reported already", self.name, submission.op_id)
                return
            del self._inflight[submission.slot]
            _, arrived, keys = holder
            self._summary.ended(status)
            self._backlog.append(completion)
            try:
                while self._backlog and self._completions.push(self._backlog[0]):
                    self._backlog.popleft()
            except ProtocolError as exc:
                log.error("%s: %s; dropping the session", self.name, exc)
                self.stop()  # run() wakes up and closes the session
                return
            if len(self._backlog) > self._layout.slots:
                # A client frees a slot only once it has read the slot's completion, so it
                # never leaves more unread than it has slots; one that posts to slots whose
                # completions it leaves unread would grow this without end.
                log.error(
                    "%s: the client leaves more completions unread than it has slots (%d); "
                    "dropping the session",
                    self.name,
                    self._layout.slots,
                )
                self.stop()
                return
            self._ringing += 1
        try:
            doorbell.ring(self._complete_doorbell)
        finally:
            with self._lock:
                self._ringing -= 1
                if self._closed:
                    self._close_complete_doorbell()
        mark(Stage.COMPLETE, submission.op_id)
        self._metrics.completed(
            Op(submission.op), self.tenant, status, keys, hits, time.monotonic() - arrived
        )

    def _close_complete_doorbell(self) -> None:
        """Under the lock, once closed: close the doorbell when no thread rings it (once)."""
        if not self._ringing and self._complete_doorbell >= 0:
            os.close(self._complete_doorbell)
            self._complete_doorbell = -1

    def _client_alive(self) -> bool:
        try:
            data = self._sock.recv(1, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if data:
            raise ProtocolError("client wrote to the socket after the handshake")
        return False

    def dispatch(self, submissions: list[Submission]) -> None:
        """The requests behind one doorbell. Lookups first: they are answered here, from memory;
        the rest only queue work for the I/O threads, in the order they came (which stable
        sorting keeps), the loads in groups (loads.py). Raises ProtocolError."""
        mark(Stage.DISPATCH, len(submissions))
        wanted: list[Load] = []
        for submission in sorted(submissions, key=lambda s: s.op != Op.EXISTS):
            self._dispatch(submission, wanted)
        for group in groups(wanted):
            self._work.loads(group)

    def _dispatch(self, submission: Submission, wanted: list[Load]) -> None:
        """Answer a lookup, queue a store or delete, or add a load to ``wanted``."""
        op = self._check(submission)
        arena = self._layout.arena(self._memory, submission.slot)
        keys = decode_keys(bytes(arena[: submission.request_bytes]), KEYS_PER_REQUEST_MAX)
        self._claim(submission, len(keys))
        if time.monotonic_ns() > submission.deadline_ns:
            self.complete(submission, Status.EXPIRED)
        elif op == Op.EXISTS:
            found = self._store.exists(self.tenant, keys)
            self._summary.looked_up(len(keys), sum(found))
            self.complete(submission, *results(arena, found))
        elif op == Op.DELETE:
            self._work.delete(submission, keys, arena)
        else:
            self._queue_data_op(op, submission, keys, arena, wanted)

    def _check(self, submission: Submission) -> Op:
        if submission.op not in Op.__members__.values():
            raise ProtocolError(f"unknown op code {submission.op}")
        flags = submission.flags
        if flags not in (0, FLAG_L1, FLAG_REMOTE) or (flags and submission.op != Op.SET):
            raise ProtocolError(f"flags {flags:#x} are not valid for op {submission.op}")
        if submission.slot >= self._layout.slots:
            raise ProtocolError(f"slot {submission.slot} is out of range")
        if submission.request_bytes > self._layout.arena_bytes:
            raise ProtocolError(f"request of {submission.request_bytes} bytes overflows its arena")
        with self._lock:
            if submission.slot in self._inflight:  # before its arena is read
                raise ProtocolError(f"slot {submission.slot} reused while its op is in flight")
        return Op(submission.op)

    def _claim(self, submission: Submission, keys: int) -> None:
        """Hold the op's slot until it completes (its arrival and keys are for the metrics).
        Only this session's thread claims slots, so ``_check`` saw it free."""
        with self._lock:
            self._inflight[submission.slot] = submission.op_id, time.monotonic(), keys

    def _queue_data_op(
        self, op: Op, submission: Submission, keys: list[str], arena: memoryview, wanted: list[Load]
    ) -> None:
        if len(keys) != 1:
            raise ProtocolError(f"a {op.name} carries one key, got {len(keys)}")
        key = keys[0]
        if submission.flags & FLAG_L1:
            extent = l1_pages(self._l1, self.object_bytes_max, submission)
        else:
            extent = window_range(self._window, submission)
        if op == Op.GET:
            wanted.append(Load(submission, key, extent, submission.data_bytes))
            return
        l1: L1Object | RemoteObject | None = None
        if submission.flags:
            given_up = functools.partial(self._given_up, given_up_word(submission, arena))
            if submission.flags & FLAG_L1:
                assert self._l1 is not None  # l1_pages raised otherwise
                l1 = L1Object(self._l1, submission.data_offset, given_up)
                self._summary.zero_copy()
            else:
                if self._remote is None:
                    raise ProtocolError("a remote-copy store on a session without remote copy")
                l1 = RemoteObject(self._remote, source_address(submission, arena), given_up)
                self._summary.remote_copy()
        self._work.store(submission, key, extent, l1)

    def _given_up(self, word: memoryview) -> bool:
        """Whether the client gave a zero-copy store up (its word set), or is going: from
        then on LMCache may rewrite the buffer (adp_wire/protocol.py, ``given_up_span``)."""
        return word != _CLEAR or self._l1_readers.closing or _hung_up(self._sock)


def _hung_up(sock: socket.socket) -> bool:
    """Whether the client has closed its end (or died): polled, never read."""
    poller = select.poll()
    poller.register(sock, select.POLLRDHUP)
    return any(events & _HUNG_UP for _, events in poller.poll(0))


_HUNG_UP = select.POLLRDHUP | select.POLLHUP | select.POLLERR | select.POLLNVAL
