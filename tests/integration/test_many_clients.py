"""Goal: one gateway serves eight lmcache servers at once (separate processes, each with its own
plugin and ring), and every chunk they store comes back from L2 byte-exact; a server SIGKILLed
while its L2 stores are in flight frees its session (log line, fds, shared memory) without
disturbing the seven others, and a server started after it is served."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support import Gateway, LMCacheServer, session_resources, wait_until
from tests.support.many_clients_driver import (
    l2_stores_in_flight,
    store,
    store_then_load_from_l2,
)
from tests.support.plugin import make_tenant_table

pytestmark = pytest.mark.integration

SERVERS = 8
CHUNKS = 8  # of 1 MiB (256 tokens of mp_client's KV) per store
ROUNDS = 2  # store-then-load rounds of each surviving server
VICTIM_CHUNKS = 64  # a large store, so that the kill lands while its L2 writes are in flight


def session_memfds(gateway: Gateway) -> int:
    """Session shared-memory files the gateway has mapped (distinct memfds, however split)."""
    assert gateway.proc is not None
    maps = Path(f"/proc/{gateway.proc.pid}/maps").read_text().splitlines()
    return len({line.split()[4] for line in maps if "memfd:adp-session" in line})


def connected_pids(gateway: Gateway) -> list[int]:
    """The client pid of every session the gateway accepted, in order, but this process's."""
    found = re.findall(r"session \d+ \(pid (\d+) .*\) connected", gateway.log())
    return [int(pid) for pid in found if int(pid) != os.getpid()]


def closed_line(gateway: Gateway, pid: int) -> str | None:
    """The gateway's summary line of the session of client ``pid``, once it is closed."""
    found = re.search(rf"session \d+ \(pid {pid} .*\) closed: .*", gateway.log())
    return found.group(0) if found else None


def start_together(servers: list[LMCacheServer]) -> None:
    with ThreadPoolExecutor(len(servers)) as pool:
        list(pool.map(LMCacheServer.start, servers))


def rounds(server: LMCacheServer, first_seed: int) -> None:
    for seed in range(first_seed, first_seed + ROUNDS):
        store_then_load_from_l2(server, seed, CHUNKS)


def kill_mid_transfer(server: LMCacheServer, first_seed: int, attempts: int = 5) -> None:
    """Store until the server has L2 stores in flight at the plugin, then SIGKILL it."""
    for seed in range(first_seed, first_seed + attempts):
        store(server, seed, VICTIM_CHUNKS)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not server.l2_settled():
            if l2_stores_in_flight(server) > 0:
                server.kill()
                return
    raise AssertionError(f"no L2 store of the server was ever seen in flight in {attempts} tries")


def test_eight_servers_share_one_gateway_and_a_killed_one_frees_its_session(
    gateway: Gateway, make_server: Callable[[str], LMCacheServer]
) -> None:
    make_tenant_table(gateway)
    baseline = session_resources(gateway)
    adapter = gateway.l2_adapter_json(op_timeout_s=30.0)
    servers = [make_server(adapter) for _ in range(SERVERS)]
    start_together(servers)
    wait_until(lambda: len(connected_pids(gateway)) >= SERVERS, 60, "every plugin to connect")
    assert sorted(connected_pids(gateway)) == sorted(s.proc.pid for s in servers)  # type: ignore[union-attr]
    assert session_memfds(gateway) == SERVERS
    fds_all = session_resources(gateway)[0]
    fds_per_session, uneven = divmod(fds_all - baseline[0], SERVERS)
    assert fds_per_session > 0 and uneven == 0, (baseline, fds_all)
    victim, others = servers[0], servers[1:]
    victim_pid = victim.proc.pid  # type: ignore[union-attr]

    with ThreadPoolExecutor(len(others)) as pool:
        work = [pool.submit(rounds, server, 100 * n) for n, server in enumerate(others, 1)]
        kill_mid_transfer(victim, first_seed=1000)
        wait_until(lambda: closed_line(gateway, victim_pid) is not None, 30, "the session to close")
        wait_until(lambda: session_memfds(gateway) == SERVERS - 1, 30, "its memory to be unmapped")
        wait_until(
            lambda: session_resources(gateway)[0] == fds_all - fds_per_session,
            30,
            f"its {fds_per_session} fds to be closed",
        )
        for done in work:
            done.result()  # each surviving server's every chunk came back from L2 byte-exact
    print(closed_line(gateway, victim_pid))
    assert "dropping the session" not in gateway.log()
    assert len(connected_pids(gateway)) == SERVERS  # no survivor lost its session meanwhile

    newcomer = make_server(adapter).start()
    wait_until(lambda: len(connected_pids(gateway)) == SERVERS + 1, 60, "the new plugin")
    store_then_load_from_l2(newcomer, seed=5000, chunks=CHUNKS)

    for server in [*others, newcomer]:
        assert server.stop() in (0, 130)  # 130: it exits by re-raising SIGINT
    wait_until(
        lambda: session_resources(gateway) == baseline,
        30,
        f"every session's fds and shared memory to be freed (baseline {baseline})",
    )
    assert gateway.alive
