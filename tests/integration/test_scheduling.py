"""Goal: the gateway's scheduling holds through real processes. A real gateway process serves
real plugins (one ADPConnector per session), and what is checked is the order in which their
completions arrive, never how long they took:

- a load submitted behind a deep store backlog completes while most of the backlog is queued;
- over its store_backlog_max, the gateway refuses stores at once (the plugin reports them
  failed) while the ones it took are stored, and it goes on serving;
- one session flooding stores does not make another session's stores wait for the whole flood;
- ops that cannot start before their deadline complete as failures and are then dropped by the
  gateway without their I/O, never left queued or run late.

Slow disks are made with tests/support/faulty_gateway.py (every I/O first sleeps), so the
orders asserted here hold with a wide margin on a loaded machine.
"""

from __future__ import annotations

import select
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from lmcache_adp import ADPConnector
from tests.support import Gateway, wait_until
from tests.support.faulty_gateway import FaultyGateway
from tests.support.plugin import connected

pytestmark = pytest.mark.integration
MiB = 2**20
WAIT_S = 60  # bound on any wait for completions; never reached when the gateway works


class Clients:
    """Real plugins, one gateway session each, whose completions are recorded in the order
    this test sees them across all of them: ``order`` holds (client, future id, ok)."""

    def __init__(self, gateway: Gateway, names: list[str], op_timeout_s: float = 30) -> None:
        params = gateway.adapter_params(op_timeout_s=op_timeout_s)
        self.plugins = {name: ADPConnector(**params) for name in names}
        self.order: list[tuple[str, int, bool]] = []
        self.results: dict[tuple[str, int], list[bool]] = {}
        self._sources: list[memoryview] = []  # kept alive until their stores complete
        try:
            for plugin in self.plugins.values():
                connected(plugin)
        except BaseException:
            self.close()
            raise

    def store(self, name: str, key: str, data: bytes) -> tuple[str, int]:
        source = memoryview(bytearray(data))
        self._sources.append(source)
        return name, self.plugins[name].submit_batch_set([key], [source])

    def load(self, name: str, key: str, into: bytearray) -> tuple[str, int]:
        return name, self.plugins[name].submit_batch_get([key], [memoryview(into)])

    def exists(self, name: str, keys: list[str]) -> list[bool]:
        future = name, self.plugins[name].submit_batch_exists(keys)
        self.wait({future})
        return [bool(b) for b in self.results[future]]

    def wait(self, futures: set[tuple[str, int]]) -> None:
        """Until every one of ``futures`` has completed, recording all completions seen."""
        deadline = time.monotonic() + WAIT_S
        while not futures <= self.done:
            assert time.monotonic() < deadline, "ops did not complete"
            fds = {plugin.event_fd(): name for name, plugin in self.plugins.items()}
            ready, _, _ = select.select(list(fds), [], [], 0.5)
            for fd in ready:
                for future_id, ok, _, per_key in self.plugins[fds[fd]].drain_completions():
                    self.order.append((fds[fd], future_id, bool(ok)))
                    self.results[fds[fd], future_id] = per_key or []

    @property
    def done(self) -> set[tuple[str, int]]:
        return {(name, future_id) for name, future_id, _ in self.order}

    def position(self, future: tuple[str, int]) -> int:
        return next(i for i, (n, f, _) in enumerate(self.order) if (n, f) == future)

    def ok(self, future: tuple[str, int]) -> bool:
        return self.order[self.position(future)][2]

    def close(self) -> None:
        for plugin in self.plugins.values():
            plugin.close()


def data(seed: int, size: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def key(name: str, number: int) -> str:
    return f"m@00000000@0@{name}{number:060x}"


def gateway_with(workdir: Path, config: str) -> FaultyGateway:
    """A real gateway process whose database can be slowed on command."""
    path = workdir / "gateway.yaml"
    path.write_text(config)
    gateway = FaultyGateway(workdir, "1GiB", "--config", str(path))
    gateway.start()
    return gateway


@pytest.fixture
def made(workdir: Path) -> Iterator[list[object]]:
    """Gateways and clients a test made, stopped whatever happens."""
    things: list[object] = []
    yield things
    for thing in reversed(things):
        if isinstance(thing, Clients):
            thing.close()
        elif isinstance(thing, Gateway):
            thing.kill()


def queued(clients: Clients, name: str) -> None:
    """Returns once every op ``name`` submitted so far is queued in the gateway (or done): the
    plugin submits in order, and the gateway answers an EXISTS as it reads it off the ring."""
    clients.exists(name, ["barrier"])


@pytest.mark.parametrize("loader", ["flooder", "other"])
def test_a_load_overtakes_a_deep_store_backlog(
    workdir: Path, made: list[object], loader: str
) -> None:
    gateway = gateway_with(workdir, "io_threads: 2\n")
    made.append(gateway)
    clients = Clients(gateway, ["flooder", "other"])
    made.append(clients)
    probe = data(1, MiB)
    first = clients.store("other", key("probe", 0), probe)
    clients.wait({first})
    assert clients.ok(first)

    gateway.inject(database=0, delay_s=0.1)  # a slow disk: the stores queue up
    flood = [clients.store("flooder", key("flood", i), data(i, MiB)) for i in range(64)]
    queued(clients, "flooder")
    into = bytearray(MiB)
    load = clients.load(loader, key("probe", 0), into)
    clients.wait({load})
    stored_before = sum(1 for f in flood if f in clients.done)
    assert clients.ok(load) and bytes(into) == probe
    assert stored_before < len(flood) // 2, f"the load waited for {stored_before} stores"
    gateway.inject(clear=True)
    clients.wait(set(flood))
    assert all(clients.ok(f) for f in flood)  # the backlog is served, not dropped


def test_stores_over_the_backlog_bound_are_refused_at_once(
    workdir: Path, made: list[object]
) -> None:
    gateway = gateway_with(workdir, "io_threads: 1\nstore_backlog_max: 8MiB\n")
    made.append(gateway)
    clients = Clients(gateway, ["flooder"])
    made.append(clients)
    gateway.inject(database=0, delay_s=0.5)  # the first store it takes holds the thread 0.5 s
    objects = {key("flood", i): data(i, MiB) for i in range(40)}
    flood = [clients.store("flooder", k, v) for k, v in objects.items()]
    clients.wait({flood[-1]})  # the last one: refused, or the test fails below
    gateway.inject(clear=True)
    clients.wait(set(flood))

    taken = [f for f in flood if clients.ok(f)]
    refused = [f for f in flood if not clients.ok(f)]
    assert flood[:8] == taken[:8] and flood[-1] in refused
    # When each store was refused, at most 8 (8 MiB) were queued and 1 running: the gateway
    # pushes its completions in order, so those taken before it and not yet completed.
    for r in refused:
        earlier = [t for t in taken if t[1] < r[1]]
        assert sum(clients.position(t) > clients.position(r) for t in earlier) <= 8 + 1
    # Refused at once: every refusal completed before the first store the gateway took.
    assert max(map(clients.position, refused)) < min(map(clients.position, taken))
    stored = clients.exists("flooder", list(objects))
    assert stored == [clients.ok(f) for f in flood]  # a refused store left nothing behind

    # Still healthy: the same session stores what was refused, and loads it back.
    again = {k: objects[k] for k, ok in zip(objects, stored, strict=True) if not ok}
    retry = [clients.store("flooder", k, v) for k, v in list(again.items())[-6:]]
    clients.wait(set(retry))
    assert all(clients.ok(f) for f in retry)
    into = bytearray(MiB)
    load = clients.load("flooder", key("flood", 39), into)
    clients.wait({load})
    assert clients.ok(load) and bytes(into) == objects[key("flood", 39)]
    assert gateway.alive and "dropping the session" not in gateway.log()


def test_a_store_flood_does_not_make_another_session_wait_for_all_of_it(
    workdir: Path, made: list[object]
) -> None:
    gateway = gateway_with(workdir, "io_threads: 1\n")
    made.append(gateway)
    clients = Clients(gateway, ["flooder", "other"])
    made.append(clients)
    gateway.inject(database=0, delay_s=0.05)
    flood = [clients.store("flooder", key("flood", i), data(i, MiB)) for i in range(40)]
    queued(clients, "flooder")
    theirs = [clients.store("other", key("other", i), data(100 + i, MiB)) for i in range(4)]
    clients.wait(set(theirs))
    flood_before = sum(1 for f in flood if f in clients.done)
    assert all(clients.ok(f) for f in theirs)
    # Sessions take turns: the other session's 4 stores went in between the flood's, not after.
    assert flood_before < len(flood) // 2, f"they waited for {flood_before} of the flood's stores"
    gateway.inject(clear=True)
    clients.wait(set(flood))
    assert all(clients.ok(f) for f in flood)


def test_ops_that_cannot_start_before_their_deadline_fail_and_are_never_run(
    workdir: Path, made: list[object]
) -> None:
    gateway = gateway_with(workdir, "io_threads: 1\n")
    made.append(gateway)
    clients = Clients(gateway, ["client"], op_timeout_s=1.0)
    made.append(clients)
    probe = data(1, MiB)
    first = clients.store("client", key("probe", 0), probe)
    clients.wait({first})
    assert clients.ok(first)

    # A stall longer than the deadline holds the only I/O thread with whichever op came first;
    # every other op waits in the gateway's queue past its deadline.
    gateway.inject(database=0, delay_s=2.5)
    into = [bytearray(MiB) for _ in range(3)]
    stuck = [clients.store("client", key("stuck", i), data(i, MiB)) for i in range(5)]
    stuck += [clients.load("client", key("probe", 0), b) for b in into]
    clients.wait(set(stuck))
    assert not any(clients.ok(f) for f in stuck)  # each completed as a failure
    gateway.inject(clear=True)

    # Once the thread is free, the expired ops are dropped without their I/O: a store queued
    # behind them completes, and none of the expired stores (but the one running) was written.
    def a_store_completes() -> bool:
        after = clients.store("client", key("after", 0), data(9, MiB))
        clients.wait({after})
        return clients.ok(after)

    wait_until(a_store_completes, 30, "a store after the stall")
    written = clients.exists("client", [key("stuck", i) for i in range(5)])
    assert sum(written) <= 1 and not any(written[1:]), written
    load = clients.load("client", key("probe", 0), into[0])
    clients.wait({load})
    assert clients.ok(load) and bytes(into[0]) == probe
