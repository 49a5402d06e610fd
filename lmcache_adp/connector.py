"""``ADPConnector``: LMCache's native_plugin L2 adapter, forwarding to the storage gateway.

Contract with LMCache (its wrapper, lmcache/v1/distributed/l2_adapters/
native_plugin_l2_adapter.py in LMCache 0.5.6):

- ``submit_batch_*`` run under LMCache's adapter lock: they append to a bounded inbox, ring a
  doorbell and return a future id; they never block or wait. A full inbox fails the new batch
  at once.
- Every future completes exactly once, as ``(future_id, ok, error, per_key_bools)`` with one bool
  per key, within its deadline whatever the gateway does (alive, dead, hung, restarting):
  ``lookup_timeout_s`` for EXISTS, ``op_timeout_s`` for the rest, plus at most the memcpy of
  the slices then in progress on its buffers (lmcache_adp/batch.py).
- Lookups never wait behind loads or stores, and loads never wait behind stores, on the one
  session an LMCache server has (lmcache_adp/lanes.py). Most never reach the gateway at all:
  the submit call answers them from the tenant's presence table (lmcache_adp/lookups.py).
- L1 buffers are written only by this plugin's copy threads (a load lands in the transfer window
  and is copied into L1 once verified), and only before the batch is reported (invariant 4).
  When LMCache's L1 is shared memory (``lmcache server --shm-name``), a store of whole pages is
  written to the disk straight from L1: the gateway only reads those pages, takes their
  checksums before it asks whether the store was given up, and asks again once it has written
  them, so a store whose buffer LMCache reused is never found (lmcache_adp/ioloop.py).
- When the gateway is down, every op completes at once as a failure or a miss, and a background
  thread keeps trying to connect; LMCache keeps serving from L1 meanwhile. The constructor waits
  at most ``CONNECT_WAIT_S`` for the first handshake, so LMCache's start-up is never held up.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import threading

from tenacity import Retrying, retry_if_result, stop_when_event_set, wait_random_exponential

from adp_wire.errors import GatewayError, HandshakeRefused, UnsupportedHost, UntrustedGateway
from adp_wire.protocol import Hello, Op
from adp_wire.threads import NamedThread
from adp_wire.tokens import read_token
from adp_wire.trace import Stage, mark
from lmcache_adp import config, l1_segment, remote_copy, trust
from lmcache_adp.batch import Batch
from lmcache_adp.ioloop import IOLoop
from lmcache_adp.link import GatewayLink
from lmcache_adp.logs import log
from lmcache_adp.shared import Shared

HANDSHAKE_TIMEOUT_S = 2.0
CONNECT_WAIT_S = 0.5  # the most the constructor waits for a first handshake
# LMCache's MP server: imported where an `lmcache server` runs the plugin, whose L1 could be put
# in shared memory; not where a client such as `lmcache bench l2` makes the adapter itself over
# buffers of its own, for which the advice would be wrong.
LMCACHE_SERVER_MODULE = "lmcache.v1.multiprocess.server"


class ADPConnector:
    """The seven methods LMCache's native_plugin wrapper calls; see the module docstring."""

    def __init__(self, **params: object) -> None:
        self._params = config.parse(params)
        token_file = self._params.token_file
        self._hello = Hello(
            tenant=self._params.tenant,
            token=read_token(token_file) if token_file else None,
            client=f"lmcache pid {os.getpid()}",
        )
        self._state = ""  # the link's last reported state, logged once per change
        self._shared = Shared(self._params)
        self._future_ids = itertools.count(1)
        self._probe = remote_copy.Probe() if self._params.remote_copy else None
        self._first_attempt = threading.Event()
        self._closing = threading.Lock()
        self._shared.want_link.set()
        self._io = IOLoop(self._shared)
        self._threads = [
            NamedThread(target=self._io.run, name="adp-io", daemon=True),
            NamedThread(target=self._connect_loop, name="adp-connect", daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        # A gateway that is up serves the very first op; one that is down or hung costs LMCache's
        # start-up at most CONNECT_WAIT_S, and the plugin goes on connecting in the background.
        self._first_attempt.wait(CONNECT_WAIT_S)

    # The native_plugin surface -------------------------------------------------------------

    def event_fd(self) -> int:
        return self._shared.completions.fd

    def submit_batch_set(self, keys: list[str], memviews: list[memoryview]) -> int:
        return self._submit(Op.SET, keys, memviews)

    def submit_batch_get(self, keys: list[str], memviews: list[memoryview]) -> int:
        return self._submit(Op.GET, keys, memviews)

    def submit_batch_exists(self, keys: list[str]) -> int:
        return self._submit(Op.EXISTS, keys, None)

    def submit_batch_delete(self, keys: list[str]) -> int:
        try:
            return self._submit(Op.DELETE, keys, None)
        except Exception:  # LMCache's eviction thread dies on any exception from here
            log.exception("a delete could not be queued")
            future_id = next(self._future_ids)
            count = len(keys) if isinstance(keys, list) else 0
            self._shared.completions.push(
                future_id, False, "delete could not be queued", [False] * count
            )
            return future_id

    def drain_completions(self) -> list[tuple[int, bool, str, list[bool] | None]]:
        return self._shared.completions.drain()

    def close(self) -> None:
        """Return once no thread of this plugin touches an L1 buffer any more, every future
        is reported, the plugin holds none of LMCache's buffers (LMCache may unmap its L1), and
        the gateway has let go of L1 (or one op timeout has passed: it only ever reads L1).
        A second call does nothing but wait for the first."""
        with self._closing:
            if self._shared.stopping.is_set():
                return
            self._shared.stopping.set()
            self._shared.want_link.set()
            self._shared.wake_io()
            for thread in self._threads:
                thread.join()
            self._io.shutdown()
            while self._shared.new_links:
                self._shared.new_links.popleft().close()
            os.close(self._shared.wake)
            self._shared.completions.close()
            self._shared.untaken.report_offline()

    # Internals -----------------------------------------------------------------------------

    def _submit(self, op: Op, keys: list[str], memviews: list[memoryview] | None) -> int:
        future_id = next(self._future_ids)
        keys = [str(k) for k in keys]
        if op == Op.EXISTS and not self._shared.stopping.is_set():
            found = self._look_up(keys)
            if found is not None:
                self._shared.completions.push(future_id, True, "", found)
                return future_id
        timeout_s = self._params.lookup_timeout_s if op == Op.EXISTS else self._params.op_timeout_s
        buffers = None if memviews is None else [m.cast("B") for m in memviews]
        batch = Batch(future_id, op, keys, buffers, timeout_s)
        mark(Stage.SUBMIT, future_id)
        malformed = buffers is not None and len(buffers) != len(keys)
        if malformed or self._shared.stopping.is_set() or not self._shared.inbox.put(batch):
            why = "bad batch" if malformed else "closed or too many ops waiting"
            if op == Op.SET:
                self._shared.untaken.count(batch)
            self._shared.completions.push(future_id, False, why, batch.results)
        return future_id

    def _look_up(self, keys: list[str]) -> list[bool] | None:
        """The answer from the tenant's presence table, when it has one (lmcache_adp/lookups.py)."""
        lookups = self._shared.lookups
        if lookups is None or not keys:
            return None
        try:
            return lookups.find(keys)
        except Exception:  # whatever the table holds, the ring still answers
            log.exception("the presence table could not answer a lookup; asking the gateway")
            return None

    def _connect_loop(self) -> None:
        """Whenever the I/O thread wants a link: handshake until one succeeds, waiting a
        random time between attempts from a window that doubles from reconnect_interval_s up
        to reconnect_interval_max_s (full jitter), so the plugins of a host whose gateway
        restarts do not all knock at once."""
        attempts = Retrying(
            retry=retry_if_result(lambda connected: not connected),
            wait=wait_random_exponential(
                multiplier=self._params.reconnect_interval_s,
                max=self._params.reconnect_interval_max_s,
            ),
            stop=stop_when_event_set(self._shared.stopping),
            sleep=self._pause,
            retry_error_callback=lambda _: False,  # closing
        )
        while not self._shared.stopping.is_set():
            self._shared.want_link.wait()
            if not self._shared.stopping.is_set():
                attempts(self._attempt)
        self._first_attempt.set()

    def _pause(self, seconds: float) -> None:
        self._shared.stopping.wait(seconds)  # close() cuts it short

    def _attempt(self) -> bool:
        try:
            connected = self._try_connect()
        except Exception:  # a surprise (a bug, EMFILE reading /proc) must not end the retries
            log.exception("unexpected error connecting to the gateway; trying again")
            connected = False
        self._first_attempt.set()
        return connected

    def _try_connect(self) -> bool:
        """One handshake; on success the I/O thread picks the link up at its next step."""
        segment = l1_segment.find() if self._params.zero_copy else None
        path = config.socket_path(self._params)
        trusted = trust.trusted_uids(self._params.gateway_uids)
        try:
            link = GatewayLink.connect(
                path, self._hello, HANDSHAKE_TIMEOUT_S, trusted, segment, self._probe
            )
        except (UntrustedGateway, UnsupportedHost) as exc:
            self._report_state(
                "untrusted",
                logging.ERROR,
                f"refusing the gateway at {path}: {exc}; L2 ops fail and LMCache serves from L1",
            )
            return False
        except HandshakeRefused as exc:
            self._report_state(
                "refused",
                logging.ERROR,
                f"the gateway at {path} refused tenant {self._params.tenant!r}: {exc}",
            )
            return False
        except (OSError, GatewayError) as exc:
            self._report_state(
                "unreachable",
                logging.WARNING,
                f"cannot reach the gateway at {path} ({exc}); L2 ops fail and LMCache serves "
                "from L1 until it is reachable: start `adp-gateway serve --socket "
                f"{path}`, or set the adapter's socket_path to the gateway's --socket",
            )
            return False
        if link.l1 is not None:
            stores = "zero-copy stores from L1"
        elif link.remote:
            stores = "the gateway copies stores out of L1 itself (remote copy)"
        else:
            stores = "copy path"
            in_a_server = LMCACHE_SERVER_MODULE in sys.modules  # not a bench client's advice
            if self._params.zero_copy and segment is None and in_a_server:
                stores += ": L1 is private memory"
                if self._params.remote_copy:
                    stores += " and the gateway may not read this process (remote copy)"
                stores += "; `lmcache server --shm-name NAME --no-l1-use-lazy` "
                stores += "(configs/lmcache-server.sh) keeps the stores' copies out of LMCache"
        self._report_state(
            "connected",
            logging.INFO,
            f"connected to the gateway at {path} (session {link.welcome.session_id}, {stores})",
        )
        self._shared.want_link.clear()
        self._shared.new_links.append(link)
        self._shared.wake_io()
        return True

    def _report_state(self, state: str, level: int, message: str) -> None:
        """Log the link's state once per change, not at every retry."""
        if state != self._state or state == "connected":
            self._state = state
            log.log(level, message)
