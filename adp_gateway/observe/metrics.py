"""The gateway's Prometheus metrics, and its ``/healthz`` and ``/readyz``, on one HTTP port.

Off by default; ``metrics_address: 127.0.0.1:9464`` in the config (or ``--metrics-address``)
serves them. Names follow Prometheus' conventions (units last, ``_total`` for counters):

- ``adp_gateway_keys_total{op,outcome,tenant}``: keys of client ops. ``op`` is ``lookup``,
  ``load``, ``store`` or ``delete``; ``outcome`` is ``hit`` or ``miss`` (lookups, loads,
  deletes), ``ok`` (stores), ``failed``, ``refused`` (admission control) or ``expired`` (its
  deadline passed before it could start). They count what LMCache counts: a lookup's keys,
  a load's chunks, a store's chunks. Most lookups the plugin answers itself from the
  tenant's presence table (adp_wire/presence.py) and counts in its session's shared memory;
  the gateway adds those counts here every 100 ms and before each scrape.
- ``adp_gateway_ops_total{op,outcome,tenant}``: the same for ring requests (a lookup of many
  keys is one or a few requests; one the plugin answered itself is none).
- ``adp_gateway_read_bytes_total{tenant}``, ``adp_gateway_written_bytes_total{tenant}``: object
  bytes loaded (hits) and stored (acknowledged).
- ``adp_gateway_untaken_stores_total{tenant}``, ``adp_gateway_untaken_bytes_total{tenant}``:
  stores LMCache handed a plugin that no tier below L1 took, whatever failed them (their
  deadline passed while they waited, the gateway refused or failed them, the device failed);
  LMCache holds those chunks in L1 only. The plugins count them in their sessions' shared
  memory, folded in like their lookups.
- ``adp_gateway_op_duration_seconds{op}``: from a request's arrival to its completion.
- ``adp_gateway_queued_ops{queue}``, ``adp_gateway_store_backlog_bytes``: the scheduler's queues;
  ``adp_gateway_write_depth_bytes``: the bytes of stores that may write at once (what the devices
  drain in 25 ms at the rate stores were last seen to write: adp_gateway/scheduling/write_depth.py).
- ``adp_gateway_io_threads{state}``: the config's ``size``, the I/O threads ``alive``, and those
  ``held`` by a task running a second or more (scheduling/io_threads.py starts others beside
  them).
- ``adp_gateway_at_io_thread_share{holder}``: sessions (by reads of their client's memory) and
  databases holding every I/O thread they may (scheduler.py): a client or a drive that does not
  answer, or a flood.
- ``adp_gateway_sessions{tenant}``, ``adp_gateway_sessions_opened_total``.
- ``adp_gateway_objects``, ``adp_gateway_capacity_bytes``, ``adp_gateway_used_bytes``,
  ``adp_gateway_tenant_pool_bytes{tenant}`` / ``..._limit_bytes{tenant}`` (quota pools),
  ``adp_gateway_evicted_regions_total``, ``adp_gateway_device_errors_total{database}``.
- ``adp_gateway_recovery_seconds``: how long the last start-up took to rebuild the index.
- Admission (adp_gateway/policy/admission.py): ``adp_gateway_admission_stores_total{decision}``
  and ``adp_gateway_admission_bytes_total{decision}`` (``admitted`` or ``declined``; a declined
  store is also counted ``ok`` among the keys, as LMCache counts it stored),
  ``adp_gateway_admission_declined_for_budget_total`` (the rest were declined for the card's
  pressure), ``adp_gateway_admission_bar`` (the card's pressure's: 0, every store written; 1,
  only keys seen before; 2, only keys seen twice before), ``adp_gateway_eviction_age_seconds``
  (how long objects lately lasted before eviction), ``adp_gateway_write_rate_bytes_per_second``
  (the last minute's),
  ``adp_gateway_write_budget_bytes_per_second`` and ``adp_gateway_write_budget_level`` (the
  bucket, 0 empty to 1 full; both absent without a budget), ``adp_gateway_drive_writes_per_day``
  (projected at the last minute's rate).

``/healthz`` answers 200 while the process runs and its housekeeping thread (which expires
queued ops every 100 ms) keeps ticking, 503 once that thread has been stuck for 10 s (a
liveness probe then restarts it); ``/readyz`` 200 once the index is recovered and the socket
listens, 503 before and while stopping.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from adp_gateway.errors import ConfigError
from adp_wire.protocol import Op, Status
from adp_wire.threads import NamedThread

log = logging.getLogger(__name__)
SCRAPES_MAX = 32  # connections to the metrics port served at once
SCRAPE_TIMEOUT_S = 5.0  # a connection is closed this long after it came
SCRAPE_SLOT_WAIT_S = 1.0  # a connection past SCRAPES_MAX waits this long for one to end
OP_NAMES = {Op.EXISTS: "lookup", Op.GET: "load", Op.SET: "store", Op.DELETE: "delete"}
OUTCOMES = {
    Status.FAILED: "failed",
    Status.REJECTED: "refused",
    Status.EXPIRED: "expired",
    Status.MISS: "miss",
}
_DURATION_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                       0.25, 0.5, 1.0, 2.5, 5.0, 10.0)  # fmt: skip


class Metrics:
    """Everything the gateway counts; sessions report into it, the HTTP endpoint reads it."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        labels = ["op", "outcome", "tenant"]
        self.keys = Counter(
            "adp_gateway_keys", "Keys of client ops", labels, registry=self.registry
        )
        self.ops = Counter("adp_gateway_ops", "Ring requests", labels, registry=self.registry)
        self.read_bytes = Counter(
            "adp_gateway_read_bytes", "Object bytes loaded", ["tenant"], registry=self.registry
        )
        self.written_bytes = Counter(
            "adp_gateway_written_bytes", "Object bytes stored", ["tenant"], registry=self.registry
        )
        self.untaken_stores = Counter(
            "adp_gateway_untaken_stores",
            "Stores LMCache handed a plugin that no tier below L1 took",
            ["tenant"],
            registry=self.registry,
        )
        self.untaken_bytes = Counter(
            "adp_gateway_untaken_bytes",
            "Bytes of the stores no tier below L1 took",
            ["tenant"],
            registry=self.registry,
        )
        self.op_duration = Histogram(
            "adp_gateway_op_duration_seconds",
            "From a request's arrival to its completion",
            ["op"],
            buckets=_DURATION_BUCKETS_S,
            registry=self.registry,
        )
        self.sessions_opened = Counter(
            "adp_gateway_sessions_opened", "Sessions begun", registry=self.registry
        )
        self.recovery_seconds = Gauge(
            "adp_gateway_recovery_seconds", "Index rebuild at start-up", registry=self.registry
        )
        # Plain running totals (keys per op, bytes), for the last minute's rates in `status`.
        self.totals: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        # A metric's child per label values, found once: prometheus_client's labels() call
        # builds and validates its key each time, which cost the gateway about 6% of its
        # Python time at 256 KiB loads.
        self._labelled: Callable[..., Any] = functools.lru_cache(maxsize=4096)(
            lambda metric, *values: metric.labels(*values)
        )

    def completed(
        self, op: Op, tenant: str, status: Status, keys: int, hits: int, seconds: float
    ) -> None:
        """One ring request done: ``hits`` of its ``keys`` found (lookups and deletes; a load
        or store is one key, a hit or stored when ``status`` is OK)."""
        name = OP_NAMES[op]
        if status == Status.OK:
            found = "ok" if op == Op.SET else "hit"
            self._count_keys(name, tenant, keys, hits, found)
            outcome = found if hits else "miss"
        else:
            outcome = OUTCOMES.get(status, "failed")
            self._labelled(self.keys, name, outcome, tenant).inc(keys)
            self._count_total(name, keys)
        self._labelled(self.ops, name, outcome, tenant).inc()
        self._labelled(self.op_duration, name).observe(seconds)

    def looked_up(self, tenant: str, keys: int, hits: int) -> None:
        """Keys the plugin looked up in the presence table, ``hits`` of them found."""
        self._count_keys(OP_NAMES[Op.EXISTS], tenant, keys, hits, "hit")

    def untaken(self, tenant: str, stores: int, nbytes: int) -> None:
        """Stores a plugin did not take (its count, folded in by its session)."""
        self._labelled(self.untaken_stores, tenant).inc(stores)
        self._labelled(self.untaken_bytes, tenant).inc(nbytes)

    def _count_keys(self, name: str, tenant: str, keys: int, hits: int, found: str) -> None:
        self._labelled(self.keys, name, found, tenant).inc(hits)
        if keys > hits:
            self._labelled(self.keys, name, "miss", tenant).inc(keys - hits)
        self._count_total(name, keys)

    def _count_total(self, name: str, keys: int) -> None:
        with self._lock:
            self.totals[f"{name}_keys"] += keys

    def moved(self, direction: str, tenant: str, nbytes: int) -> None:
        """Object bytes ``read`` (a load hit) or ``written`` (a store)."""
        counter = self.read_bytes if direction == "read" else self.written_bytes
        self._labelled(counter, tenant).inc(nbytes)
        with self._lock:
            self.totals[f"{direction}_bytes"] += nbytes

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.totals)

    def add_collector(self, collector: Collector) -> None:
        self.registry.register(collector)


class Rates:
    """Per-second rates of the running totals over about the last minute, from snapshots
    taken every few seconds (``sample``)."""

    def __init__(self, metrics: Metrics, window_s: float = 60.0) -> None:
        self._metrics = metrics
        self._window_s = window_s
        self._samples: collections.deque[tuple[float, dict[str, int]]] = collections.deque()

    def sample(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._samples.append((now, self._metrics.snapshot()))
        while len(self._samples) > 1 and self._samples[1][0] <= now - self._window_s:
            self._samples.popleft()

    def per_second(self) -> dict[str, float]:
        if not self._samples:
            return {}
        started, then = self._samples[0]
        now, current = time.monotonic(), self._metrics.snapshot()
        seconds = max(now - started, 1e-9)
        return {k: round((v - then.get(k, 0)) / seconds, 3) for k, v in sorted(current.items())}


class LiveState(Collector):
    """Gauges read from the gateway when scraped: sessions, queues, capacity, devices."""

    def __init__(self, read: Callable[[], dict[str, Any]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        state = self._read()
        sessions = GaugeMetricFamily("adp_gateway_sessions", "Clients connected", labels=["tenant"])
        for tenant, count in state["sessions"].items():
            sessions.add_metric([tenant], count)
        yield sessions
        queued = GaugeMetricFamily("adp_gateway_queued_ops", "Ops queued", labels=["queue"])
        for queue, count in state["queued"].items():
            queued.add_metric([queue], count)
        yield queued
        yield _gauge("adp_gateway_store_backlog_bytes", "Bytes of stores queued", state)
        yield _gauge(
            "adp_gateway_write_depth_bytes", "Bytes of stores that may write at once", state
        )
        at_share = GaugeMetricFamily(
            "adp_gateway_at_io_thread_share",
            "Sessions (by reads of their client's memory) and databases holding every I/O thread "
            "they may: a client or a drive that does not answer, or a flood",
            labels=["holder"],
        )
        for holder, count in state["at_io_thread_share"].items():
            at_share.add_metric([holder], count)
        yield at_share
        threads = GaugeMetricFamily(
            "adp_gateway_io_threads",
            "I/O threads: io_threads (size), alive, and held by a task running a second or "
            "more (while fewer than io_threads are free, another starts beside a held one)",
            labels=["state"],
        )
        for key in ("size", "alive", "held"):
            threads.add_metric([key], state["io_threads"][key])
        yield threads
        yield _gauge("adp_gateway_objects", "Objects stored", state)
        yield _gauge("adp_gateway_capacity_bytes", "Bytes the databases can hold", state)
        yield _gauge("adp_gateway_used_bytes", "Bytes of regions in use", state)
        pools = GaugeMetricFamily(
            "adp_gateway_tenant_pool_bytes",
            "Bytes of regions held by a quota pool",
            labels=["tenant"],
        )
        limits = GaugeMetricFamily(
            "adp_gateway_tenant_pool_limit_bytes",
            "The most a quota pool may hold",
            labels=["tenant"],
        )
        for tenant, (held, limit) in state["pools"].items():
            pools.add_metric([tenant], held)
            limits.add_metric([tenant], limit)
        yield pools
        yield limits
        evicted = CounterMetricFamily(
            "adp_gateway_evicted_regions", "Regions reclaimed to make room"
        )
        evicted.add_metric([], state["evicted_regions"])
        yield evicted
        errors = CounterMetricFamily(
            "adp_gateway_device_errors", "Failed reads and writes", labels=["database"]
        )
        for database, count in state["device_errors"].items():
            errors.add_metric([str(database)], count)
        yield errors
        yield from _admission(state["admission"])


def _admission(state: dict[str, Any]) -> Iterator[Metric]:
    """What admission did, and the drive's writes against the budget (service.py's status)."""
    stores = CounterMetricFamily(
        "adp_gateway_admission_stores", "Stores admitted or declined", labels=["decision"]
    )
    nbytes = CounterMetricFamily(
        "adp_gateway_admission_bytes", "Bytes of stores admitted or declined", labels=["decision"]
    )
    for decision in ("admitted", "declined"):
        stores.add_metric([decision], state[decision])
        nbytes.add_metric([decision], state[f"{decision}_bytes"])
    yield stores
    yield nbytes
    yield CounterMetricFamily(
        "adp_gateway_admission_declined_for_budget",
        "Stores declined to keep within the write budget",
        value=state["declined_for_budget"],
    )
    yield GaugeMetricFamily(
        "adp_gateway_admission_bar",
        "How often a key must be seen before for the card's pressure to let its store be written",
        value=state["bar"],
    )
    if state["eviction_age_s"] is not None:
        yield GaugeMetricFamily(
            "adp_gateway_eviction_age_seconds",
            "How long objects lately lasted before eviction",
            value=state["eviction_age_s"],
        )
    yield GaugeMetricFamily(
        "adp_gateway_write_rate_bytes_per_second",
        "Object bytes written per second over the last minute",
        value=state["write_rate_bytes_per_s"],
    )
    yield GaugeMetricFamily(
        "adp_gateway_drive_writes_per_day",
        "Drive writes per day of the capacity at the last minute's write rate",
        value=state["drive_writes_per_day"],
    )
    if state["write_budget_bytes_per_s"] is not None:
        yield GaugeMetricFamily(
            "adp_gateway_write_budget_bytes_per_second",
            "The write budget",
            value=state["write_budget_bytes_per_s"],
        )
        yield GaugeMetricFamily(
            "adp_gateway_write_budget_level",
            "How full the write budget's bucket is (0 to 1)",
            value=state["budget_level"],
        )


def _gauge(name: str, documentation: str, state: dict[str, Any]) -> GaugeMetricFamily:
    key = name.removeprefix("adp_gateway_")
    return GaugeMetricFamily(name, documentation, value=state[key])


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9464`` for IPv6) -> (host, port), or ConfigError."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"metrics_address: {address!r} is not HOST:PORT, such as 127.0.0.1:9464")
    return host.strip("[]"), int(port)


class MetricsServer:
    """The HTTP endpoint: /metrics, /healthz, /readyz, in a thread of its own."""

    def __init__(
        self,
        address: str,
        metrics: Metrics,
        ready: Callable[[], bool],
        alive: Callable[[], bool] = lambda: True,
        before_scrape: Callable[[], None] = lambda: None,
    ) -> None:
        """``before_scrape`` brings the counters up to date (the plugins' own counts)."""
        host, port = parse_address(address)
        metrics_app = make_wsgi_app(metrics.registry)

        def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
            path = environ.get("PATH_INFO", "")
            if path == "/healthz":
                living = alive()
                start_response("200 OK" if living else "503 Service Unavailable", [])
                return [b"alive\n" if living else b"stuck: its housekeeping thread stopped\n"]
            if path == "/readyz":
                serving = ready()
                start_response("200 OK" if serving else "503 Service Unavailable", [])
                return [b"ready\n" if serving else b"recovering or stopping\n"]
            before_scrape()
            return metrics_app(environ, start_response)  # type: ignore[no-any-return]

        try:
            self._server = make_server(host, port, app, _Server, _QuietHandler)
        except OSError as exc:
            raise ConfigError(
                f"metrics_address: cannot listen on {address}: {exc.strerror}; choose another"
            ) from exc
        self.port = self._server.server_port
        self._thread = NamedThread(target=self._server.serve_forever, name="metrics", daemon=True)

    def start(self) -> None:
        self._thread.start()
        log.info("metrics on http://%s:%d/metrics", *self._server.server_address[:2])

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Server(ThreadingMixIn, WSGIServer):
    """A thread a connection, at most SCRAPES_MAX at once, and each connection closed
    SCRAPE_TIMEOUT_S after it came, however it trickles: a port any local user (or pod) can
    reach holds few threads, and a probe or a scrape waits SCRAPE_SLOT_WAIT_S at most for one
    of them to free."""

    daemon_threads = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._scrapes = threading.BoundedSemaphore(SCRAPES_MAX)
        self._lock = threading.Lock()
        self._deadlines: dict[Any, float] = {}  # open connection -> when it is cut
        NamedThread(target=self._cut_late, name="metrics-deadlines", daemon=True).start()

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._scrapes.acquire(timeout=SCRAPE_SLOT_WAIT_S):
            self.shutdown_request(request)
            return
        with self._lock:
            self._deadlines[request] = time.monotonic() + SCRAPE_TIMEOUT_S
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._done(request)
            self.shutdown_request(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._done(request)

    def _done(self, request: Any) -> None:
        with self._lock:
            self._deadlines.pop(request, None)
        self._scrapes.release()

    def _cut_late(self) -> None:
        """Shut the connections past their deadline (their threads then end)."""
        while True:
            time.sleep(SCRAPE_TIMEOUT_S / 5)
            now = time.monotonic()
            with self._lock:
                late = [r for r, deadline in self._deadlines.items() if deadline < now]
            for request in late:
                with contextlib.suppress(OSError):
                    request.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that timed out or went away: not worth a traceback on stderr."""
        log.debug("metrics: the connection from %s failed", client_address, exc_info=True)


class _QuietHandler(WSGIRequestHandler):
    timeout = SCRAPE_TIMEOUT_S  # of each read: a client that sends nothing

    def log_message(self, format: str, *args: Any) -> None:
        pass
