"""The soak test's controller: one gateway process, four client processes
(tests/support/soak_client.py), the kill schedule, the clients' models rebuilt from their event
logs, and the summary. What it checks and why is in tests/soak/test_soak.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import astuple, dataclass, field
from pathlib import Path
from typing import Any

from tests.support import BIN, Gateway, Process, wait_until
from tests.support.crash_model import FRAGMENT_BYTES, Model, apply, key_name
from tests.support.soak_sampling import (
    FDS_PER_PRESENCE_TABLE,
    SHMEM_DRAINED_MIB_MAX,
    Lifetime,
    Sampler,
    fd_listing,
    growth_findings,
    read_sample,
)

CLIENTS = 4
KEYS_PER_CLIENT = 200
CAPACITY = "64MiB"
# Admission off: the soak is about a store that writes and evicts all the time, and the default
# write budget (1 DWPD of 64 MiB) would decline most stores after the first seconds.
GATEWAY_YAML = f"""\
admission: false
databases_per_dir: 2
region_size: {2**20}
fragment_size: {FRAGMENT_BYTES}
io_threads: 4
session_slots: 64
session_window_size: 64MiB
sync: always
log_level: DEBUG
"""
TICK_S = 0.1  # the controller's loop: read new events, kill on schedule
READY_TIMEOUT_S = 60.0  # a started client reaches the gateway
NOTICE_TIMEOUT_S = 30.0  # the gateway closes the sessions of killed clients
CONNECT_TIMEOUT_S = 30.0  # live clients reconnect to a restarted gateway
TRAFFIC_BEFORE_KILL_S = (0.5, 2.0)  # restarted clients work this long before the gateway kill
FREE_TIMEOUT_S = 10.0  # then its fds and mappings are back (in-flight I/O may hold them)
RECLAIM_LINE = "reclaimed database"
VERIFY_MISS_LINE = "is not what the index says"  # a load raced its region's reuse: a miss
NOT_OPS = ("client_kills", "gateway_kills", "records_checked")  # the other counts in stats
CONNECTED = re.compile(
    r"session \d+ \(.*\) connected( \((zero-copy to its L1|remote copy from its memory)\))?$",
    re.MULTILINE,
)
CLOSED = re.compile(r"session \d+ \(.*\) closed: ", re.MULTILINE)


@dataclass(frozen=True)
class SoakPlan:
    name: str
    duration_s: float
    lifetime_s: tuple[float, float]  # gateway kills are this far apart
    client_kill_every_s: tuple[float, float]
    warmup_s: float  # samples of a lifetime's first seconds are not judged
    lifetime_min_s: float  # the last lifetime runs this long at least, past the duration if need be


SHORT = SoakPlan("short", 45, (20, 25), (4, 7), 5, 15)
LONG = SoakPlan("long", 600, (120, 180), (10, 20), 20, 60)
NEVER = (1e9, 1e9)


class SoakFailure(AssertionError):
    """A wrong byte, a leak, or a gateway or client that misbehaved."""


# Reading the clients' events ----------------------------------------------------------------


class EventTail:
    """The complete lines appended to a JSON-lines file since the last ``read``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()  # a torn last line of a killed client never completes
        events = []
        for line in lines:
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return events


@dataclass
class Client:
    """One client slot: its model (carried from run to run) and its current process."""

    index: int
    model: Model
    run: int = 0  # how many processes this slot has started
    process: Process | None = None
    tail: EventTail | None = None
    open_ops: dict[int, dict[str, Any]] = field(default_factory=dict)
    ready: bool = False
    lifetime_ends: int = 0  # lifetime_end events seen from the current process

    def floating(self) -> dict[str, list[int]]:
        return {str(k): sorted(s.floating) for k, s in enumerate(self.model.states) if s.floating}


# The controller -----------------------------------------------------------------------------


class Soak:
    def __init__(
        self,
        workdir: Path,
        plan: SoakPlan,
        seed: int,
        clients: int = CLIENTS,
        plant_wrong_bytes: bool = False,
        gateway_class: type[Gateway] = Gateway,
        free_timeout_s: float = FREE_TIMEOUT_S,
    ) -> None:
        self.workdir = workdir
        self.plan = plan
        self.seed = seed
        self.rng = random.Random(seed)
        self.plant_wrong_bytes = plant_wrong_bytes
        self.free_timeout_s = free_timeout_s
        config_path = workdir / "gateway.yaml"
        config_path.write_text(GATEWAY_YAML)
        self.gateway = gateway_class(workdir, CAPACITY, "--config", str(config_path))
        total_keys = clients * KEYS_PER_CLIENT
        self.clients = [Client(c, Model(total_keys)) for c in range(clients)]
        self.lifetimes: list[Lifetime] = []
        self.sampler: Sampler | None = None
        self.fds_idle = 0
        self.stats: Counter[str] = Counter()
        self.started = time.monotonic()

    @property
    def lifetime(self) -> Lifetime:
        return self.lifetimes[-1]

    # The schedule ---------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        self.started = time.monotonic()
        end = self.started + self.plan.duration_s
        self._start_gateway()
        self.fds_idle = self._idle_fds()
        self._start_clients(self.clients)
        next_client_kill = self._after(self.plan.client_kill_every_s)
        next_gateway_kill = self._next_gateway_kill(end)
        while time.monotonic() < max(end, self.lifetime.started + self.plan.lifetime_min_s):
            self._poll()
            if time.monotonic() >= next_client_kill:
                self._kill_random_client()
                next_client_kill = self._after(self.plan.client_kill_every_s)
            elif time.monotonic() >= next_gateway_kill:
                self._next_lifetime()
                next_gateway_kill = self._next_gateway_kill(end)
            time.sleep(TICK_S)
        self._poll()
        self._end_lifetime_drained()
        self._stop_gateway_and_check_disk()
        return self.summary()

    def _after(self, range_s: tuple[float, float]) -> float:
        return time.monotonic() + self.rng.uniform(*range_s)

    def _next_gateway_kill(self, end: float) -> float:
        """The next gateway kill, or never where it would leave too short a last lifetime."""
        at = self._after(self.plan.lifetime_s)
        return at if end - at >= self.plan.lifetime_min_s else float("inf")

    def _next_lifetime(self) -> None:
        """Drain and judge this lifetime, then kill the gateway under fresh traffic and
        start the next on the same data dir; the live clients must reconnect by themselves."""
        self._end_lifetime_drained()
        self._start_clients(self.clients)
        self.lifetime.phase = "end"
        deadline = self._after(TRAFFIC_BEFORE_KILL_S)
        while time.monotonic() < deadline:
            self._poll()
            time.sleep(TICK_S)
        self._kill_gateway()
        self._end_client_lifetimes()
        self._start_gateway()
        self._wait_reconnected()

    # The gateway ----------------------------------------------------------------------------

    def _start_gateway(self) -> None:
        mark = self.gateway.log_path.stat().st_size if self.gateway.log_path.exists() else 0
        try:
            self.gateway.start()
        except (AssertionError, TimeoutError) as exc:
            why = str(exc).splitlines()[0]
            raise SoakFailure(self._where() + f"the gateway did not start ({why})") from None
        assert self.gateway.proc is not None
        lifetime = Lifetime(len(self.lifetimes) + 1, self.gateway.proc.pid, time.monotonic(), mark)
        self.lifetimes.append(lifetime)
        self.sampler = Sampler(lifetime)

    def _idle_fds(self) -> int:
        sample = read_sample(self.lifetime.pid, self.lifetime.started, "idle")
        if sample is None:
            raise SoakFailure(self._where() + "the gateway died at once" + self._tails())
        return sample.fds

    def _kill_gateway(self) -> None:
        self._stop_sampler()
        self.gateway.kill()
        self.stats["gateway_kills"] += 1

    def _stop_sampler(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()
            self.sampler = None
        self.lifetime.seconds = time.monotonic() - self.lifetime.started

    def _gateway_log(self) -> str:
        """This lifetime's part of the gateway log."""
        with open(self.gateway.log_path, "rb") as f:
            f.seek(self.lifetime.log_mark)
            return f.read().decode(errors="replace")

    def _sessions(self) -> tuple[int, int]:
        """Sessions of this lifetime: connected, and closed again."""
        text = self._gateway_log()
        return len(CONNECTED.findall(text)), len(CLOSED.findall(text))

    def _wait_reconnected(self) -> None:
        count = len(self.clients)
        try:
            wait_until(
                lambda: self._sessions()[0] >= count,
                CONNECT_TIMEOUT_S,
                f"{count} clients to reconnect to the restarted gateway",
            )
        except TimeoutError as exc:
            raise SoakFailure(self._where() + str(exc) + self._tails()) from None

    def _end_lifetime_drained(self) -> None:
        """Kill every client: the gateway must close every session, then give back its fds
        and mappings. Then judge the lifetime's samples."""
        self.lifetime.phase = "drain"
        for client in self.clients:
            self._kill_client(client)

        def closed() -> bool:
            self._check_gateway_alive()
            connected, closed = self._sessions()
            return connected == closed

        def freed() -> bool:
            sample = read_sample(self.lifetime.pid, self.lifetime.started, "drain")
            self.lifetime.drained = sample
            return (
                sample is not None
                and sample.fds == self.fds_idle
                and sample.table_fds <= FDS_PER_PRESENCE_TABLE  # its clients share one tenant
                and sample.shmem_kib <= SHMEM_DRAINED_MIB_MAX * 1024
            )

        try:
            wait_until(closed, NOTICE_TIMEOUT_S, "the gateway to close every killed session")
            wait_until(freed, self.free_timeout_s, "the gateway to free the closed sessions")
        except TimeoutError as exc:
            raise SoakFailure(
                self._where() + f"{exc}: " + self._drain_failure() + self._tails()
            ) from None
        findings = growth_findings(
            self.lifetime.run_samples(), self.plan.warmup_s, self.fds_idle, len(self.clients)
        )
        if findings:
            raise SoakFailure(self._where() + "; ".join(findings) + self._tails())

    def _drain_failure(self) -> str:
        connected, closed = self._sessions()
        sample = read_sample(self.lifetime.pid, self.lifetime.started, "drain")
        assert sample is not None
        return (
            f"with all clients killed, {closed} of {connected} sessions closed, "
            f"{sample.fds} open fds (idle: {self.fds_idle}) and {sample.table_fds} of presence "
            f"tables (at most {FDS_PER_PRESENCE_TABLE}: one tenant), "
            f"RssShmem {sample.shmem_kib} KiB (at most {SHMEM_DRAINED_MIB_MAX} MiB); "
            f"the fds: {fd_listing(self.lifetime.pid)}"
        )

    def _stop_gateway_and_check_disk(self) -> None:
        self._stop_sampler()
        code = self.gateway.stop()
        if code != 0:
            raise SoakFailure(self._where() + f"a clean stop exited with {code}" + self._tails())
        config = str(self.workdir / "gateway.yaml")
        argv = [str(BIN / "adp-gateway"), "check", "--config", config]
        result = subprocess.run(
            [*argv, "--data-dir", str(self.gateway.data_dir)], capture_output=True, text=True
        )
        summary = (result.stdout.strip().splitlines() or [result.stderr])[-1]
        if result.returncode != 0 or " 0 damaged" not in summary:
            raise SoakFailure(self._where() + f"adp-gateway check:\n{result.stdout}{result.stderr}")
        self.stats["records_checked"] = int(summary.split(": ")[1].split()[0])

    def _check_gateway_alive(self) -> None:
        if not self.gateway.alive:
            raise SoakFailure(self._where() + "the gateway died unasked" + self._tails())

    # The clients ----------------------------------------------------------------------------

    def _start_clients(self, clients: list[Client]) -> None:
        for client in clients:
            self._spawn_client(client)
        for client in clients:
            self._wait_ready(client)

    def _spawn_client(self, client: Client) -> None:
        client.run += 1
        state = {
            "model": client.model.to_json(),
            "floating": client.floating(),
            "strict": False,
            "budget": -1,
        }
        state_path = self.workdir / f"state-{client.index}.json"
        state_path.write_text(json.dumps(state))
        events_path = self.workdir / f"events-{client.index}-{client.run:03d}.jsonl"
        argv = [sys.executable, "-m", "tests.support.soak_client"]
        argv += ["--socket", str(self.gateway.socket_path), "--state", str(state_path)]
        argv += ["--events", str(events_path), "--seed", str(self.rng.randrange(2**32))]
        argv += ["--client", str(client.index), "--keys-per-client", str(KEYS_PER_CLIENT)]
        if self.plant_wrong_bytes:
            argv.append("--plant-wrong-bytes")
        if client.index % 2:  # half the clients keep their buffers in a shared-memory L1
            argv.append("--shared-l1")
        client.process = Process(
            f"client {client.index}", self.workdir / f"client-{client.index}.log"
        )
        client.tail = EventTail(events_path)
        client.open_ops.clear()
        client.ready = False
        client.lifetime_ends = 0
        env = {**os.environ, "LMCACHE_TRACK_USAGE": "false", "DO_NOT_TRACK": "1"}
        client.process.spawn(argv, env=env)

    def _wait_ready(self, client: Client) -> None:
        def ready() -> bool:
            self._poll_client(client)
            return client.ready

        try:
            wait_until(ready, READY_TIMEOUT_S, f"client {client.index} to reach the gateway")
        except TimeoutError as exc:
            raise SoakFailure(self._where() + str(exc) + self._tails(client)) from None

    def _kill_random_client(self) -> None:
        client = self.rng.choice(self.clients)
        self._kill_client(client)
        self.stats["client_kills"] += 1
        self.lifetime.client_kills += 1
        self._start_clients([client])

    def _kill_client(self, client: Client) -> None:
        """SIGKILL the client; what it had in flight may still land while the gateway lives."""
        assert client.process is not None
        assert client.process.proc is not None
        pid = client.process.proc.pid
        client.process.kill()
        _remove_l1_segment(pid)
        self._poll_client(client, expect_alive=False)
        for event in client.open_ops.values():
            apply(client.model, {**event, "ev": "ack", "ok": False})
        client.open_ops.clear()
        client.process = None

    def _end_client_lifetimes(self) -> None:
        """The gateway is dead: each client must end the lifetime in its model."""
        for client in self.clients:
            assert client.process is not None
            client.process.send_signal(signal.SIGUSR1)
        for client in self.clients:
            ends = client.lifetime_ends

            def ended(client: Client = client, ends: int = ends) -> bool:
                self._poll_client(client)
                return client.lifetime_ends > ends

            try:
                wait_until(ended, NOTICE_TIMEOUT_S, f"client {client.index} to end the lifetime")
            except TimeoutError as exc:
                raise SoakFailure(self._where() + str(exc) + self._tails(client)) from None

    # Events ---------------------------------------------------------------------------------

    def _poll(self) -> None:
        self._check_gateway_alive()
        for client in self.clients:
            self._poll_client(client)

    def _poll_client(self, client: Client, expect_alive: bool = True) -> None:
        assert client.tail is not None and client.process is not None
        alive = client.process.alive
        events = client.tail.read()
        for event in events:
            self._absorb(client, event)
        bad = [e for e in events if e["ev"] == "violation" or e.get("match") is False]
        if bad:
            self._fail_on_violation(client, bad[0])
        if expect_alive and not alive:
            assert client.process.proc is not None
            code = client.process.proc.returncode
            raise SoakFailure(
                self._where()
                + f"client {client.index} (run {client.run}) exited with {code}"
                + self._tails(client)
            )

    def _absorb(self, client: Client, event: dict[str, Any]) -> None:
        """Replay one event into the client's model and the counts."""
        kind, op = event["ev"], event.get("op")
        apply(client.model, event)
        if kind == "submit" and op in ("store", "delete"):
            client.open_ops[event["n"]] = event
        elif kind == "ack":
            client.open_ops.pop(event["n"], None)
            self._count(event)
        elif kind == "lifetime_end":
            client.model.end_lifetime()
            client.lifetime_ends += 1
        elif kind == "ready":
            client.ready = True

    def _count(self, ack: dict[str, Any]) -> None:
        op, stats = ack["op"], self.stats
        if op == "load" and ack["hit"]:
            stats["load_hits_verified"] += 1
            stats["bytes_loaded_verified"] += ack["len"]
        elif op == "load":
            stats["load_misses" if ack["ok"] else "loads_failed"] += 1
        elif op == "store":
            stats["stores_acknowledged" if ack["ok"] else "stores_failed"] += 1
            stats["bytes_stored_acknowledged"] += ack["len"] if ack["ok"] else 0
        elif op == "delete":
            stats["deletes_done" if ack["ok"] else "deletes_failed"] += 1
        else:
            stats["exists_answered" if ack["ok"] else "exists_failed"] += 1
            stats["exists_found"] += bool(ack["ok"] and ack["found"])

    def _fail_on_violation(self, client: Client, event: dict[str, Any]) -> None:
        if event["ev"] != "violation":  # the client writes its details on the next line
            assert client.process is not None and client.process.proc is not None
            assert client.tail is not None
            with contextlib.suppress(subprocess.TimeoutExpired):
                client.process.proc.wait(10)  # it stops at once on a violation
            details = [e for e in client.tail.read() if e["ev"] == "violation"]
            event = details[0] if details else {**event, "kind": "wrong_bytes", "text": ""}
        raise SoakFailure(
            self._where() + f"client {client.index} (run {client.run}): [{event['kind']}] key "
            f"{event['key']} ({key_name(event['key'])}): {event['text']}" + self._tails(client)
        )

    # Reporting ------------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        log = self.gateway.log()
        return {
            "form": self.plan.name,
            "seed": self.seed,
            "seconds": round(time.monotonic() - self.started, 1),
            "clients": len(self.clients),
            "keys_per_client": KEYS_PER_CLIENT,
            "capacity": CAPACITY,
            "client_kills": self.stats["client_kills"],
            "gateway_kills": self.stats["gateway_kills"],
            "client_runs": sum(c.run for c in self.clients),
            "sessions": len(CONNECTED.findall(log)),
            "regions_reclaimed": log.count(RECLAIM_LINE),
            "zero_copy_sessions": log.count("(zero-copy to its L1)"),
            "loads_failing_verification": log.count(VERIFY_MISS_LINE),
            "records_checked": self.stats["records_checked"],
            "ops": {k: v for k, v in sorted(self.stats.items()) if k not in NOT_OPS},
            "lifetimes": [lt.summary(self.fds_idle, self.plan.warmup_s) for lt in self.lifetimes],
        }

    def _where(self) -> str:
        number = self.lifetimes[-1].number if self.lifetimes else 0
        return (
            f"gateway lifetime {number}, {time.monotonic() - self.started:.1f} s in "
            f"(seed {self.seed}): "
        )

    def _tails(self, client: Client | None = None) -> str:
        gateway_tail = "\n".join(self.gateway.log().splitlines()[-30:])
        text = f"\n--- gateway log tail ---\n{gateway_tail}"
        if client is not None:
            client_log = self.workdir / f"client-{client.index}.log"
            lines = (
                client_log.read_text(errors="replace").splitlines() if client_log.exists() else []
            )
            text += f"\n--- client {client.index} log tail ---\n" + "\n".join(lines[-15:])
        return text

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()
        samples = {lt.number: [astuple(s) for s in lt.samples] for lt in self.lifetimes}
        (self.workdir / "samples.json").write_text(json.dumps(samples))  # for a post-mortem
        for client in self.clients:
            if client.process is not None and client.process.proc is not None:
                client.process.kill()
                _remove_l1_segment(client.process.proc.pid)
        self.gateway.kill()


def _remove_l1_segment(pid: int) -> None:
    """The shared-memory L1 a killed client could not remove itself (see crash_driver.py)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(f"/dev/shm/lmcache_l1_pool_crash{pid}")


def format_summary(summary: dict[str, Any]) -> str:
    lines = [
        f"soak {summary['form']}: {summary['seconds']} s, seed {summary['seed']}, "
        f"{summary['clients']} clients x {summary['keys_per_client']} keys, "
        f"capacity {summary['capacity']}: {summary['client_kills']} client kills, "
        f"{summary['gateway_kills']} gateway kills, {summary['sessions']} sessions, "
        f"{summary['regions_reclaimed']} regions reclaimed, "
        f"{summary['zero_copy_sessions']} sessions with L1 in shared memory, "
        f"{summary['loads_failing_verification']} loads missed on verification, "
        f"{summary['records_checked']} records checked after the clean stop",
        "  " + ", ".join(f"{k}={v}" for k, v in summary["ops"].items()),
    ]
    for lt in summary["lifetimes"]:
        lines.append(
            f"  lifetime {lt['lifetime']}: {lt['seconds']} s, {lt['client_kills']} client kills, "
            f"VmRSS {_span(lt['rss_mib'])} MiB, private {_span(lt['private_mib'])} MiB "
            f"(growth {lt['private_growth_mib']}), RssShmem {_span(lt['shmem_mib'])} MiB, "
            f"fds {_span(lt['fds'])} (idle {lt['fds_idle']}); all clients killed: "
            f"{lt['fds_drained']} fds, VmRSS {lt['rss_mib_drained']} MiB, "
            f"RssShmem {lt['shmem_mib_drained']} MiB"
        )
    return "\n".join(lines)


def _span(pair: list[Any]) -> str:
    return f"{pair[0]}-{pair[1]}"
