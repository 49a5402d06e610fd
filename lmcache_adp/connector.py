"""``ADPConnector``: LMCache's native_plugin L2 adapter, forwarding to the storage gateway.

Contract with LMCache (shared/reference/lmcache-native-plugin.md, section 1):

- ``submit_batch_*`` run under LMCache's adapter lock: they only enqueue and return a future id.
- Every future completes exactly once, as ``(future_id, ok, error, per_key_bools)`` with one bool
  per key, within ``op_timeout_s`` whatever the gateway does (alive, dead, hung, restarting).
- Buffers (L1 memory) are touched only until their future is reported (invariant 4). On the
  copy path only this plugin's I/O thread touches them: a store's bytes are copied into the
  transfer window when it is submitted to the gateway, a load's bytes are copied out of the
  window when the gateway has verified them. An expired future is reported first and its late
  gateway completion then only frees the window.
- Zero-copy: when L1 is LMCache's shared-memory segment (``lmcache server --shm-name``), the
  gateway moves a buffer's bytes between the disk and L1 itself, and the plugin computes (store)
  or verifies (load) the payload checksums. Such an op is reported at its deadline only when its
  slot's fence shows the gateway is not inside it, and the gateway starts no op within
  ``L1_START_MARGIN_NS`` of its deadline; so an op the gateway is moving when its deadline
  passes is reported when that move ends (docs/design.md, "The zero-copy fence").
- When the gateway is down, every op completes at once as a failure or a miss, and a background
  thread keeps trying to connect; LMCache keeps serving from L1 meanwhile.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time

from gateway.errors import GatewayError, HandshakeRefused
from gateway.protocol import Hello, Op
from gateway.tenants import read_token
from lmcache_adp import config, l1
from lmcache_adp.ioloop import Batch, IOLoop, Shared
from lmcache_adp.link import GatewayLink

log = logging.getLogger("lmcache_adp")
HANDSHAKE_TIMEOUT_S = 2.0


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
        self._refusal = ""  # the gateway's last refusal, logged once rather than at every retry
        self._shared = Shared(self._params)
        self._future_ids = itertools.count(1)
        # A gateway that is up serves the very first op; one that is not costs one refused
        # connect here, and the plugin starts anyway (connecting in the background).
        if not self._try_connect():
            self._shared.want_link.set()
        self._io = IOLoop(self._shared)
        self._threads = [
            threading.Thread(target=self._io.run, name="adp-io", daemon=True),
            threading.Thread(target=self._connect_loop, name="adp-connect", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

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

    # Internals -----------------------------------------------------------------------------

    def _submit(self, op: Op, keys: list[str], memviews: list[memoryview] | None) -> int:
        future_id = next(self._future_ids)
        keys = [str(k) for k in keys]
        deadline_ns = time.monotonic_ns() + int(self._params.op_timeout_s * 1e9)
        buffers = None if memviews is None else [m.cast("B") for m in memviews]
        batch = Batch(future_id, op, keys, buffers, deadline_ns, [False] * len(keys))
        if (buffers is not None and len(buffers) != len(keys)) or self._shared.stopping.is_set():
            self._shared.completions.push(future_id, False, "bad batch or closed", batch.results)
            return future_id
        self._shared.incoming.append(batch)
        self._shared.wake_io()
        return future_id

    def _connect_loop(self) -> None:
        while not self._shared.stopping.is_set():
            self._shared.want_link.wait()
            if self._shared.stopping.is_set():
                return
            if not self._try_connect():
                self._shared.stopping.wait(self._params.reconnect_interval_s)

    def _try_connect(self) -> bool:
        """One handshake; on success the I/O thread picks the link up at its next step."""
        segment = l1.find() if self._params.zero_copy else None
        try:
            link = GatewayLink.connect(
                self._params.socket_path, self._hello, HANDSHAKE_TIMEOUT_S, segment
            )
        except HandshakeRefused as exc:
            if str(exc) != self._refusal:
                self._refusal = str(exc)
                log.error(
                    "the gateway at %s refused tenant %r: %s (retrying every %.1f s)",
                    self._params.socket_path,
                    self._params.tenant,
                    exc,
                    self._params.reconnect_interval_s,
                )
            return False
        except (OSError, GatewayError) as exc:
            log.debug("gateway at %s not reachable: %s", self._params.socket_path, exc)
            return False
        self._refusal = ""
        log.info(
            "connected to the gateway at %s (session %d, %s)",
            self._params.socket_path,
            link.welcome.session_id,
            "zero-copy to L1" if link.l1 is not None else "copy path",
        )
        self._shared.want_link.clear()
        self._shared.new_links.append(link)
        self._shared.wake_io()
        return True
