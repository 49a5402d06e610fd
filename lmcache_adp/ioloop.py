"""The thread that drives the plugin's link to the gateway.

It alone touches the link (slots, window allocator, rings) and the lanes, and it copies only
objects of at most 512 KiB (lmcache_adp/copier.py). Larger copies between L1 and the window run
on the copier's threads, which hand their results back through ``Shared.call``. So a 32 MiB copy
never delays a completion, a lookup or LMCache's own threads. A zero-copy store is not read here
at all: the gateway takes its checksums from L1, and the plugin sets the store's given-up word
before it reports the store failed while the gateway may still be reading it.
See lmcache_adp/connector.py for the contract with LMCache, and lmcache_adp/outcomes.py and
batch.py for how a batch is reported exactly once, on time, and never while one of its buffers is
being copied.

One step: adopt a new link; admit new batches into their lanes and post what fits; take the
gateway's completions; take the copiers' results; post what now fits; fail what is past its
deadline. Posting goes lane by lane (lookups first, stores last), and the doorbell rings after
each lane before the stores', so no lookup, load or delete waits for the work of posting stores.
A step posts at most ``STORE_POSTS_PER_STEP`` stores; while more wait, the next step starts at
once, after letting go of the GIL instead of polling.
"""

from __future__ import annotations

import select
import time
from collections import deque
from collections.abc import Callable

from adp_wire.errors import GatewayError
from adp_wire.protocol import Op, Status
from adp_wire.ring import doorbell
from adp_wire.ring.layout import Completion
from adp_wire.trace import Stage, mark
from lmcache_adp import config
from lmcache_adp.batch import Batch
from lmcache_adp.copier import Copier
from lmcache_adp.lanes import Lane, Lanes, room
from lmcache_adp.link import GatewayLink, Request
from lmcache_adp.logs import log
from lmcache_adp.outcomes import Outcomes
from lmcache_adp.shared import Shared

IDLE_POLL_MS = 200
# Posting one store holds the GIL for about 15 us (a batch of 32: 0.5 ms). A step posts at most
# this many and the next step comes round at once, so between them the link's thread lets go of
# the GIL (a lookup in LMCache's process waits for a few posts, not for a batch's) and takes new
# lookups and loads first.
STORE_POSTS_PER_STEP = 4


class IOLoop:
    def __init__(self, shared: Shared) -> None:
        self._shared = shared
        self._link: GatewayLink | None = None
        self._lanes = Lanes(shared.params)
        self._outcomes = Outcomes(shared.completions, self._give_up, shared.untaken)
        self._copier = Copier(config.copy_threads(shared.params))
        self._preparing: deque[Request] = deque()  # stores being copied, in submission order
        self._posted = False  # submissions since the last doorbell
        self._store_posts_left = STORE_POSTS_PER_STEP  # this step's

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
                self._fail_everything()

    def shutdown(self) -> None:
        """After ``run`` has returned: let the copies end, report every batch, failed unless
        done, including those never taken from the inbox, and close the link once the gateway
        has let go of our L1 (up to one op timeout: it only ever reads L1, so a hung gateway
        cannot harm it)."""
        for batch in self._shared.inbox.close():
            self._outcomes.refuse(batch, "the plugin is closing")
        self._copier.close()
        self._run_calls()
        link = self._link
        if link is not None and any(link.reads_l1(r) for r in link.inflight.values()):
            link.shutdown()
            if not link.wait_closed(self._shared.params.op_timeout_s):
                log.warning("the gateway did not let go of L1 in time; closing anyway")
        self._fail_everything()

    # One step ----------------------------------------------------------------------------

    def _wait(self) -> None:
        if self._store_posts_left == 0:  # stores may wait for the next step's turn
            time.sleep(0)  # a thread waiting for the GIL (a lookup's) takes it now
            return
        poller = select.poll()
        poller.register(self._shared.wake, select.POLLIN)
        if self._link is not None:
            poller.register(self._link.complete_doorbell, select.POLLIN)
            poller.register(self._link.sock_fd, select.POLLIN)
        poller.poll(self._outcomes.ms_to_next_deadline(IDLE_POLL_MS))
        doorbell.answer(self._shared.wake)

    def _step(self) -> None:
        self._store_posts_left = STORE_POSTS_PER_STEP
        while self._shared.new_links:  # a newer link replaces ours without asking for another
            self._drop_link(reconnect=False)
            self._link = self._shared.new_links.popleft()
            self._shared.lookups = self._link.lookups
            self._shared.untaken.attach(self._link.untaken)
        if self._link is not None and not self._link.alive():
            for completion, request in self._link.completions():  # done before it went
                self._finish(request, completion)
            log.warning("the gateway went away; ops fail until it is back")
            self._drop_link()
        self._accept()  # first: a new lookup is on its way before any other work of this step
        if self._link is not None:
            for completion, request in self._link.completions():
                self._finish(request, completion)
        self._run_calls()
        if self._link is None:
            for request in self._lanes.drain():
                self._outcomes.settle(request, Status.FAILED)
        else:
            self._post()
        self._outcomes.expire()
        self._ring()

    def _ring(self) -> None:
        if self._posted and self._link is not None:
            self._link.ring()
        self._posted = False

    def _run_calls(self) -> None:
        while self._shared.calls:
            self._shared.calls.popleft()()

    def _accept(self) -> None:
        """New batches into their lanes; each goes to the gateway as soon as there is room,
        before the next is admitted, so only what truly waits counts against the bounds."""
        while (batch := self._shared.inbox.take()) is not None:
            self._outcomes.track(batch)
            if not self._lanes.admit(batch):
                self._outcomes.conclude(batch, failed=True)
            elif batch.remaining == 0:
                self._outcomes.conclude(batch)  # every key too long for the protocol: all misses
            elif self._link is not None:
                self._post()

    def _post(self) -> None:
        """Give the gateway what fits, lane by lane: a request without room blocks only the
        requests behind it in its own lane."""
        link = self._link
        assert link is not None
        for lane in Lane:
            slots_max, window_bytes_max, slots_kept = room(lane, link.welcome)
            while (request := self._lanes.head(lane)) is not None:
                batch = request.batch
                if batch.done or batch.due:
                    self._lanes.pop(lane)  # reported already (expired): its rest never goes
                    continue
                if request.data_bytes > link.welcome.object_bytes_max:
                    self._lanes.pop(lane)
                    self._outcomes.settle(request, Status.REJECTED)
                    continue
                if lane == Lane.STORE:
                    if not self._store_posts_left:
                        break  # the next step's turn
                    link.place_store(request)
                if not link.try_reserve(request, slots_max, window_bytes_max, slots_kept):
                    break
                self._lanes.pop(lane)
                if lane == Lane.STORE:
                    self._store_posts_left -= 1
                    self._prepare_store(link, request)
                else:
                    self._send(link, request)
            if lane < Lane.STORE:
                self._ring()  # lookups, loads and deletes need not wait for the stores' turn

    def _send(self, link: GatewayLink, request: Request) -> None:
        batch = request.batch
        op_id = next(self._shared.op_ids)
        link.submit(op_id, request, request.payload, batch.deadline_ns)
        mark(Stage.SEND, batch.future_id)
        self._posted = True

    # Stores: L1 -> window on the copier (zero-copy, remote copy: nothing), then the ring -----

    def _prepare_store(self, link: GatewayLink, request: Request) -> None:
        batch = request.batch
        assert batch.buffers is not None
        if link.reads_l1(request):  # the gateway reads L1 itself
            self._preparing.append(request)
            self._store_ready(request, True)
            return
        if not batch.begin_touch():
            link.release(request)  # past its deadline: expire() reports it
            return
        self._preparing.append(request)
        self._copier.copy(
            link.extent(request),
            batch.buffers[request.first],
            lambda ok: self._copied(request, ok, self._store_ready),
            wanted=batch.in_time,
        )

    def _copied(self, request: Request, ok: bool, then: Callable[[Request, bool], None]) -> None:
        """On a copier thread: the copy from or into the batch's buffer has ended; go on with
        ``then`` on the link's thread."""
        request.batch.end_touch()
        mark(Stage.COPIED, request.batch.future_id)
        self._shared.call(lambda: then(request, ok))

    def _store_ready(self, request: Request, ok: bool) -> None:
        """Stores reach the gateway in the order they were submitted, however their copies
        finish: each waits in ``_preparing`` for those ahead of it (a copy's time at most)."""
        request.prepared = ok
        while self._preparing and (prepared := self._preparing[0].prepared) is not None:
            self._post_store(self._preparing.popleft(), prepared)

    def _post_store(self, request: Request, ok: bool) -> None:
        batch = request.batch
        link = request.link
        assert link is not None
        if ok and link is self._link and not (batch.done or batch.due or batch.expired):
            self._send(link, request)
            return
        link.release(request)
        self._outcomes.settle(request, Status.FAILED)

    # Completions from the gateway -------------------------------------------------------------

    def _finish(self, request: Request, completion: Completion) -> None:
        link = self._link
        assert link is not None and request.link is link
        batch = request.batch
        mark(Stage.COMPLETION, batch.future_id)
        status = (
            Status(completion.status)
            if completion.status in Status._value2member_map_
            else Status.FAILED
        )
        if batch.done or batch.due:  # reported, or to be once a copy ends: its keys stay False
            link.release(request)
            self._outcomes.settle(request, Status.FAILED)
            return
        if status == Status.OK and request.op == Op.GET:
            self._load_into_l1(link, request)
            return
        results = None
        if status == Status.OK and request.op in (Op.EXISTS, Op.DELETE):
            count = min(completion.result_bytes, len(request.keys))
            results = list(map((1).__eq__, bytes(link.arena(request)[:count])))
        link.release(request)
        self._outcomes.settle(request, status, results)

    def _load_into_l1(self, link: GatewayLink, request: Request) -> None:
        """Copy a verified load from the window into LMCache's buffer, if still in time."""
        batch = request.batch
        assert batch.buffers is not None
        if not batch.begin_touch():
            link.release(request)  # past its deadline: expire() reports it, without this key
            return
        self._copier.copy(
            batch.buffers[request.first],
            link.extent(request),
            lambda ok: self._copied(request, ok, self._loaded),
            wanted=batch.in_time,
            urgent=True,  # LMCache waits for it: never behind the copies of stores
        )

    def _loaded(self, request: Request, ok: bool) -> None:
        assert request.link is not None
        request.link.release(request)
        self._outcomes.settle(request, Status.OK if ok else Status.FAILED)

    def _give_up(self, batch: Batch) -> None:
        """Before a failed store is reported: give up its zero-copy requests at the gateway."""
        if self._link is not None:
            for request in self._link.inflight.values():
                if request.batch is batch:
                    self._link.give_up(request)

    def _drop_link(self, reconnect: bool = True) -> None:
        """Fail what is in flight on the current link and close it; by default ask for a new
        one. Requests being copied settle when their copy ends."""
        link, self._link = self._link, None
        if link is None:
            return
        self._shared.lookups = None
        self._shared.untaken.attach(None)
        for request in list(link.inflight.values()):
            link.give_up(request)  # before the batch can be reported
            link.release(request)
            self._outcomes.settle(request, Status.FAILED)
        link.inflight.clear()
        link.close()
        if reconnect:
            self._shared.want_link.set()

    def _fail_everything(self) -> None:
        self._drop_link(reconnect=not self._shared.stopping.is_set())
        for request in self._lanes.drain():
            self._outcomes.settle(request, Status.FAILED)
        self._outcomes.fail_all()
