"""The gateway process: opens the store, listens on the Unix socket (reception.py admits each
client), runs sessions and I/O threads.

Start-up order: check the config against the machine, open the databases, rebuild the index,
then listen, so a client never sees a half-recovered store. Stop order: stop accepting, fail
what is queued, let running I/O finish, sync, close the databases, remove the socket.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import socket
import threading
import time
from collections import Counter
from typing import Any

from adp_gateway import config as config_module
from adp_gateway.card.base import CardContext
from adp_gateway.config import GatewayConfig
from adp_gateway.errors import HandshakeRefused
from adp_gateway.front import unix_socket
from adp_gateway.front.reception import Reception
from adp_gateway.front.tenants import Tenants
from adp_gateway.host import hugepages
from adp_gateway.host.footprint import Footprint
from adp_gateway.host.priority import STORE_PATIENCE_S, Boost
from adp_gateway.objects.store import ObjectStore, open_store
from adp_gateway.observe.metrics import LiveState, Metrics, MetricsServer, Rates
from adp_gateway.policy.budget import SECONDS_PER_DAY
from adp_gateway.scheduling.io_threads import IoThreads
from adp_gateway.scheduling.periodic_sync import PeriodicSync
from adp_gateway.scheduling.scheduler import Scheduler
from adp_gateway.sessions.client_l1 import L1Segment
from adp_gateway.sessions.client_process import ClientProcess
from adp_gateway.sessions.presence import Presence
from adp_gateway.sessions.presence import slots_for as presence_slots_for
from adp_gateway.sessions.session import Session
from adp_wire.protocol import Hello, Status
from adp_wire.ring.layout import RingLayout
from adp_wire.ring.queue import check_host
from adp_wire.threads import NamedThread
from adp_wire.units import format_size

log = logging.getLogger(__name__)
EXPIRE_INTERVAL_S = 0.1
RATE_SAMPLE_INTERVAL_S = 5.0
STUCK_AFTER_S = 10.0  # /healthz fails once the housekeeping thread has not ticked this long
# A stop waits this long for running I/O, then this long for the seal and final sync: both
# within systemd's TimeoutStopSec (60 s in docs/operations.md), so a stuck disk never makes the
# gateway wait on the kernel for ever (docs/reliability.md, "Every wait has a deadline").
STOP_IO_WAIT_S = 10.0
CLOSE_WAIT_S = 10.0


class Gateway:
    def __init__(
        self,
        config: GatewayConfig,
        boost: Boost | None = None,
    ) -> None:
        """``boost`` gives the gateway its priority back while loads run or stores wait
        (adp_gateway/host/priority.py)."""
        check_host()
        footprint = Footprint(config)  # before anything is made: a refused start takes it back
        self._metrics_server: MetricsServer | None = None
        try:
            self._start_up(config, boost)
        except BaseException:
            self._abandon_start()
            footprint.undo()
            raise
        self._footprint = footprint

    def _start_up(
        self,
        config: GatewayConfig,
        boost: Boost | None,
    ) -> None:
        # Before the databases are touched: a second gateway on a live socket is refused
        # without creating or preallocating anything.
        unix_socket.claim(config.socket_path, config.socket_group)
        self.metrics = Metrics()
        self._rates = Rates(self.metrics)
        self._heartbeat: float | None = None  # the housekeeping thread's last tick (monotonic)
        self._ready = False  # recovered and listening: /readyz
        self._sessions: dict[int, Session] = {}
        self._starting = 0  # sessions being made, counted against max_sessions; under _lock
        self._session_ids = itertools.count(1)
        self._lock = threading.Lock()
        if config.metrics_address is not None:  # /healthz answers during the recovery too
            self._metrics_server = MetricsServer(
                config.metrics_address,
                self.metrics,
                lambda: self._ready,
                self._alive,
                self._fold_client_counts,
            )
            self._metrics_server.start()
        self.config = config_module.resolve_capacity(config)
        self._listener: socket.socket | None = None
        self._socket_file: os.stat_result | None = None  # what to remove at stop
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self.tenants = Tenants(self.config.tenants)
        self._reception = Reception(self.config, self.tenants, self._new_session, self.status)
        self._boost = boost
        self.scheduler = Scheduler(
            self.config.store_backlog_max,
            _per_database_max(self.config),
            self.config.store_inflight_max,
            boost.load_arrived if boost is not None else None,
            _per_client_reads_max(self.config),
        )
        self._io = IoThreads(
            self.config.io_threads,
            self.scheduler,
            self._stopping,
            drives_held_max=_drives_held_max(self.config),
            threads_max=_io_threads_max(self.config),
        )
        self.presence = Presence(presence_slots_for(self.config.capacity or 0))
        self.store = self._open_store()
        self._periodic_sync: PeriodicSync | None = None
        if self.config.sync == "periodic":
            self._periodic_sync = PeriodicSync(
                self.store.syncs(), self.config.sync_interval_ms / 1000
            )

    def _abandon_start(self) -> None:
        """A start refused before the store opened, or by its recovery (``_open_store``
        closes it then): let go of the metrics port."""
        if self._metrics_server is not None:
            self._metrics_server.stop()

    def _open_store(self) -> ObjectStore:
        """Open the card the config names (adp_gateway/card/loader.py) and rebuild its index."""

        context = CardContext(self.scheduler.writes_landed, self.presence)
        store = open_store(self.config, context)
        paths = self.config.database_paths
        started = time.monotonic()
        try:
            count = store.recover()
        except BaseException:  # a refused start: the databases' locks and the preparer go
            try:
                _close_store(store)
            except Exception:  # the refusal is what to report
                log.exception("closing the databases of a refused start")
            raise
        self.metrics.recovery_seconds.set(time.monotonic() - started)
        stats = store.statistics()
        log.info(
            "recovered %d objects (%s of %s) from %d database(s) in %.2f s",
            count,
            format_size(stats.used_bytes),
            format_size(stats.capacity_bytes),
            len(paths),
            time.monotonic() - started,
        )
        return store

    def _alive(self) -> bool:
        """False once the housekeeping thread has not ticked for STUCK_AFTER_S (a deadlock, or
        a stuck interpreter); True before it starts (during the recovery)."""
        beat = self._heartbeat
        return beat is None or time.monotonic() - beat < STUCK_AFTER_S

    def status(self) -> dict[str, Any]:
        """What ``adp-gateway status`` shows and the metrics' gauges read: one snapshot."""
        self._fold_client_counts()
        store = self.store.statistics()
        queued = self.scheduler.statistics()
        with self._lock:
            sessions = Counter(s.tenant for s in self._sessions.values())
        tenants = [t.name for t in self.config.tenants] or sorted(sessions)
        rates = self._rates.per_second()
        return {
            "socket": self.config.socket_path,
            "ready": self._ready,
            "capacity_bytes": store.capacity_bytes,
            "used_bytes": store.used_bytes,
            "objects": store.objects,
            "sessions": dict(sessions),
            "tenants": {t: self._tenant_state(t, sessions[t]) for t in tenants},
            "queued": dict(zip(("loads", "stores", "deletes"), queued.queued, strict=True)),
            "store_backlog_bytes": queued.store_backlog_bytes,
            "write_depth_bytes": queued.write_depth_bytes,
            "io_threads": dataclasses.asdict(self._io.state()),
            "at_io_thread_share": {
                "sessions": queued.sessions_at_share,
                "databases": queued.databases_at_share,
            },
            "evicted_regions": store.reclaims,
            "databases": self.store.card.database_states(),
            "rates_last_minute": rates,
            "admission": self._admission_state(store.capacity_bytes, rates),
        }

    def _admission_state(self, capacity_bytes: int, rates: dict[str, float]) -> dict[str, Any]:
        """What admission did, and the drive's write rate against its budget: the last
        minute's, and the drive writes per day it comes to at that rate."""
        written = rates.get("written_bytes", 0.0)
        return {
            **dataclasses.asdict(self.store.admission_statistics()),
            "write_rate_bytes_per_s": written,
            "drive_writes_per_day": written * SECONDS_PER_DAY / max(capacity_bytes, 1),
        }

    def _tenant_state(self, tenant: str, sessions: int) -> dict[str, Any]:
        held, limit = self.store.pool_bytes(tenant)
        return {"sessions": sessions, "pool_bytes": held, "pool_limit_bytes": limit}

    def _live_state(self) -> dict[str, Any]:
        status = self.status()
        pools = {t: (v["pool_bytes"], v["pool_limit_bytes"]) for t, v in status["tenants"].items()}
        errors = {d["database"]: d["errors"] for d in status["databases"]}
        return {**status, "pools": pools, "device_errors": errors}

    def start(self) -> None:
        """Listen and serve; a start refused here (the socket cannot be bound) stops what was
        opened and takes back the files this start made (footprint.py)."""
        try:
            self._listener = unix_socket.listen(self.config.socket_path, self.config.socket_group)
            self._socket_file = unix_socket.bound_identity(self.config.socket_path)
        except BaseException:
            self.stop()
            self._footprint.undo()
            raise
        listener = self._listener
        if self._periodic_sync is not None:
            self._periodic_sync.start()
        self._io.start()
        self._spawn("expire", self._expire_loop)
        self._spawn("accept", lambda: self._reception.run(listener))
        self.metrics.add_collector(LiveState(self._live_state))
        self._ready = True
        log.info("gateway listening on %s", self.config.socket_path)
        log.info("%s", hugepages.describe(hugepages.shmem_setting()))
        if self.tenants.open_mode:
            log.info(
                "no tenants declared: any process that can open the socket may use any tenant "
                "name (declare `tenants` to require credentials)"
            )

    def stop(self) -> None:
        self._ready = False
        self._stopping.set()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept(); close() alone won't
            self._listener.close()
            unix_socket.release_path(self.config.socket_path, self._socket_file)
        for task in self.scheduler.close():
            task.cancel(Status.FAILED)  # the client learns at once instead of at its deadline
        with self._lock:
            sessions = list(self._sessions.values())
        for session in sessions:
            session.stop()
        # Running I/O gets STOP_IO_WAIT_S in all to finish. A thread still inside the kernel
        # after that (a disk that does not answer) keeps its fds: the store is then left as a
        # kill leaves it (the next start walks its open regions), never closed under it.
        deadline = time.monotonic() + STOP_IO_WAIT_S
        threads = self._threads + self._io.threads()  # no I/O thread starts once stopping
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        stuck = [thread.name for thread in threads if thread.is_alive()]
        if self._periodic_sync is not None:
            stuck += self._periodic_sync.stop(max(0.0, deadline - time.monotonic()))
        if stuck:
            log.error(
                "%s still waiting on the disk after %g s: stopping without sealing the open "
                "regions or closing the databases (the next start recovers them as after a "
                "kill)",
                ", ".join(stuck),
                STOP_IO_WAIT_S,
            )
        else:
            _close_store(self.store)
        self.presence.close()
        if self._metrics_server is not None:
            self._metrics_server.stop()
        self._reception.refusals.flush()  # the refusals folded since their last line
        log.info("gateway stopped")

    def _spawn(self, name: str, target: object) -> None:
        thread = NamedThread(target=target, name=name, daemon=True)  # type: ignore[arg-type]
        thread.start()
        self._threads.append(thread)

    def _expire_loop(self) -> None:
        """Fail queued ops past their deadline, even while every I/O thread is stuck, so they
        give their slots back to their clients; start an I/O thread beside each held one
        (io_threads.py)."""
        next_sample = 0.0
        while not self._stopping.wait(EXPIRE_INTERVAL_S):
            self._heartbeat = time.monotonic()
            for task in self.scheduler.drop_expired():
                task.cancel(Status.EXPIRED)
            try:
                self._io.settle()
            except Exception:  # the deadlines above must keep being kept
                log.exception("unexpected error starting I/O threads")
            if self._boost is not None:
                self._boost.settle(self._must_not_wait)
            self._fold_client_counts()
            self._reception.refusals.flush_due()
            if time.monotonic() >= next_sample:  # the last minute's rates, for `status`
                self._rates.sample()
                next_sample = time.monotonic() + RATE_SAMPLE_INTERVAL_S

    def _must_not_wait(self) -> bool:
        """Whether the gateway's work needs its priority back (adp_gateway/host/priority.py)."""
        scheduler = self.scheduler
        return scheduler.loads_pending() or scheduler.store_waited_s() > STORE_PATIENCE_S

    def _new_session(
        self,
        conn: socket.socket,
        hello: Hello,
        peer: str,
        l1: L1Segment | None,
        remote: ClientProcess | None,
    ) -> Session:
        layout = RingLayout(
            self.config.session_slots,
            self.config.session_arena_size,
            self.config.session_window_size,
        )
        with self._lock:
            if len(self._sessions) + self._starting >= self.config.max_sessions:
                raise HandshakeRefused(
                    f"the gateway serves {self.config.max_sessions} clients already "
                    "(max_sessions); raise it in the gateway config, or stop a client"
                )
            self._starting += 1  # counted before its shared memory is made: a burst stays bound
        session = None
        try:
            session = Session(
                next(self._session_ids),
                conn,
                hello.tenant,
                peer,
                layout,
                self.store,
                self.scheduler,
                self._forget,
                self.metrics,
                l1,
                self.presence,
                remote,
            )
            self.metrics.sessions_opened.inc()
        finally:
            with self._lock:
                self._starting -= 1
                if session is not None:
                    self._sessions[session.session_id] = session
        return session

    def _fold_client_counts(self) -> None:
        """Add what each plugin counted itself (the lookups it answered from its presence
        table, the stores it did not take) to the metrics."""
        with self._lock:
            sessions = list(self._sessions.values())
        for session in sessions:
            session.fold_client_counts()

    def _forget(self, session: Session) -> None:
        with self._lock:
            self._sessions.pop(session.session_id, None)


def _close_store(store: ObjectStore) -> None:
    """Seal, sync and close ``store``, on a thread of its own: a final sync the disk never
    answers costs CLOSE_WAIT_S, not the whole stop or refused start. Raises what close raised."""
    failure: list[BaseException] = []

    def close() -> None:
        try:
            store.close()
        except BaseException as exc:  # handed to the waiting thread
            failure.append(exc)

    closer = NamedThread(target=close, name="close", daemon=True)
    closer.start()
    closer.join(CLOSE_WAIT_S)
    if closer.is_alive():
        log.error(
            "closing the databases (sealing, the final sync) has not returned in %g s: "
            "going on without waiting for it (the next start recovers what it did not do)",
            CLOSE_WAIT_S,
        )
    elif failure:
        raise failure[0]


def _per_database_max(config: GatewayConfig) -> int | None:
    """How many I/O threads ops on one database may hold: with several databases, a quarter
    of them stays for the others, however long one of them stalls."""
    if len(config.database_paths) == 1:
        return None
    return max(1, config.io_threads - config.io_threads // 4)


def _drives_held_max(config: GatewayConfig) -> int:
    """How many I/O threads held by the drives are replaced (io_threads.py): every database's
    share, or io_threads with one database."""
    per_database = _per_database_max(config)
    if per_database is None:
        return config.io_threads
    return per_database * len(config.database_paths)


def _io_threads_max(config: GatewayConfig) -> int:
    """The most I/O threads alive: io_threads, and beside them every session's share of reads
    of its client's memory and the drives' shares, held at once."""
    clients = config.max_sessions * _per_client_reads_max(config)
    return config.io_threads + clients + _drives_held_max(config)


def _per_client_reads_max(config: GatewayConfig) -> int:
    """How many I/O threads one session's reads of its client's memory may hold: a quarter of
    them (one at least) stays for the other sessions, however long a client's pages take to
    answer. With one I/O thread there is none to keep."""
    return max(1, config.io_threads - max(1, config.io_threads // 4))
