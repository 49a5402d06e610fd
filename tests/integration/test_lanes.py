"""Goal: on the one session an LMCache server has, a lookup never waits behind loads or stores,
and a load never waits behind stores, however the stores are held up (a full transfer window, a
slow disk, a stopped gateway); every op still completes, exactly once, within its deadline; and
``close()`` with ops in flight reports each of them and leaves LMCache's buffers alone.

What is checked is the order in which completions arrive on one plugin, never how long an op
took (the benchmark bench/lookup_under_load.py measures that): the stores are held for seconds
by a real gateway process whose disk is slowed on command (tests/support/faulty_gateway.py),
so the orders hold with a wide margin on a loaded machine.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from adp_gateway.sessions.presence import slots_for as presence_slots_for
from adp_wire.presence import PROBES_MAX
from lmcache_adp import ADPConnector
from tests.support import Gateway, wait_for_future, wait_until
from tests.support.faulty_gateway import FaultyGateway
from tests.support.plugin import connected, databases_of, keyed_objects
from tests.support.presence import keys_at_home

pytestmark = pytest.mark.integration
MiB = 2**20
GATEWAY_CAPACITY = 2**30  # the gateway fixture's
CONFIG = "session_window_size: 8MiB\nfragment_size: 1MiB\nregion_size: 8MiB\ndatabases_per_dir: 2\n"


class Plugin:
    """One real plugin (one session), recording the order its completions arrive in."""

    def __init__(self, gateway: Gateway, **params: object) -> None:
        self.connector = ADPConnector(**gateway.adapter_params(**params))
        connected(self.connector)
        self.order: list[int] = []
        self.items: dict[int, tuple[object, ...]] = {}
        self._kept: list[memoryview] = []  # LMCache's buffers, alive until reported

    def store(self, batch: dict[str, bytes]) -> int:
        views = [memoryview(bytearray(v)) for v in batch.values()]
        self._kept += views
        return self.connector.submit_batch_set(list(batch), views)

    def wait(self, future_id: int, timeout_s: float = 60) -> tuple[object, ...]:
        while future_id not in self.items:
            self._take(wait_for_future(self.connector, future_id, timeout_s))
        return self.items[future_id]

    def _take(self, item: tuple[object, ...]) -> None:
        for got in [item, *self.connector.__dict__.pop("_test_seen", {}).values()]:
            future_id = int(got[0])  # type: ignore[call-overload]
            self.order.append(future_id)
            self.items[future_id] = got

    def close(self) -> None:
        self.connector.close()


@pytest.fixture
def slow(workdir: Path) -> Iterator[FaultyGateway]:
    (workdir / "gateway.yaml").write_text(CONFIG)
    gateway = FaultyGateway(workdir, "512MiB", "--config", str(workdir / "gateway.yaml"))
    yield gateway.start()  # type: ignore[misc]
    gateway.kill()


@pytest.fixture
def made() -> Iterator[list[Plugin]]:
    plugins: list[Plugin] = []
    yield plugins
    for plugin in plugins:
        plugin.close()


def on_database(database: int, seed: int, count: int) -> dict[str, bytes]:
    """``count`` objects of 1 MiB whose one fragment lives on ``database``."""
    found: dict[str, bytes] = {}
    while len(found) < count:
        for key, value in keyed_objects(seed, 64, MiB).items():
            if databases_of(key, MiB) == {database} and len(found) < count:
                found[key] = value
        seed += 1000
    return found


def test_a_lookup_overtakes_stores_that_wait_for_window_room(
    slow: FaultyGateway, made: list[Plugin]
) -> None:
    plugin = Plugin(slow, op_timeout_s=60.0)
    made.append(plugin)
    stored = keyed_objects(1, 1, MiB)
    assert plugin.wait(plugin.store(stored))[1] is True
    for database in (0, 1):
        slow.inject(database=database, delay_s=1.0)  # every write now takes a second

    # 32 MiB of stores on a session whose window holds 8: most wait in the plugin for room.
    stores = [plugin.store({k: v}) for k, v in keyed_objects(2, 32, MiB).items()]
    lookup = plugin.connector.submit_batch_exists([*stored, "absent"])
    assert plugin.wait(lookup)[3] == [True, False]
    assert not set(stores) & set(plugin.order), "the lookup waited for a store"
    slow.inject(clear=True)
    assert all(plugin.wait(f)[1] is True for f in stores)


def test_a_load_overtakes_stores_that_wait_for_window_room(
    slow: FaultyGateway, made: list[Plugin]
) -> None:
    plugin = Plugin(slow, op_timeout_s=60.0)
    made.append(plugin)
    probe = on_database(1, seed=3, count=1)
    assert plugin.wait(plugin.store(probe))[1] is True
    slow.inject(database=0, delay_s=1.0)  # stores to database 0 are slow; database 1 is not

    stores = [plugin.store({k: v}) for k, v in on_database(0, seed=4, count=32).items()]
    into = bytearray(MiB)
    load = plugin.connector.submit_batch_get(list(probe), [memoryview(into)])
    assert plugin.wait(load)[3] == [True] and bytes(into) == next(iter(probe.values()))
    assert not set(stores) & set(plugin.order), "the load waited for a store"
    slow.inject(clear=True)
    assert all(plugin.wait(f)[1] is True for f in stores)


def test_a_lookup_is_answered_while_a_stopped_gateway_holds_the_stores(
    gateway: Gateway, made: list[Plugin]
) -> None:
    """The plugin answers lookups from the tenant's presence table: no thread of the gateway
    runs for them, so a stopped one does not hold them up."""
    plugin = Plugin(gateway, op_timeout_s=60.0, lookup_timeout_s=30.0)
    made.append(plugin)
    stored = keyed_objects(4, 2, MiB)
    assert plugin.wait(plugin.store(stored))[1] is True
    gateway.send_signal(signal.SIGSTOP)
    try:
        stores = [plugin.store({k: v}) for k, v in keyed_objects(5, 16, MiB).items()]
        lookup = plugin.connector.submit_batch_exists([*stored, "absent"])
        assert plugin.wait(lookup, timeout_s=30)[1:] == (True, "", [True, True, False])
        assert not set(stores) & set(plugin.order), "a store ended before the gateway resumed"
    finally:
        gateway.send_signal(signal.SIGCONT)
    assert all(plugin.wait(f)[1] is True for f in stores)


def test_a_lookup_the_table_cannot_answer_ends_within_its_own_timeout_while_the_gateway_is_stopped(
    gateway: Gateway, made: list[Plugin]
) -> None:
    """Where the presence table is not complete, lookups of keys it lacks go through the ring;
    a stopped gateway then makes them misses at lookup_timeout_s, long before the stores'
    own deadline."""
    plugin = Plugin(gateway, op_timeout_s=60.0, lookup_timeout_s=1.0)
    made.append(plugin)
    # More keys at one home cell of the tenant's table than a reader probes: one is left out.
    homes = keys_at_home(PROBES_MAX + 1, presence_slots_for(GATEWAY_CAPACITY), 0, "crowd-")
    crowd = {key: bytes([i]) * 4096 for i, key in enumerate(homes)}
    assert plugin.wait(plugin.store(crowd))[3] == [True] * len(crowd)
    gateway.send_signal(signal.SIGSTOP)
    try:
        stores = [plugin.store({k: v}) for k, v in keyed_objects(5, 16, MiB).items()]
        # One of the crowd found no cell, so only the gateway can answer for all of them.
        lookup = plugin.connector.submit_batch_exists(list(crowd))
        assert plugin.wait(lookup, timeout_s=30)[3] == [False] * len(crowd)
        assert not set(stores) & set(plugin.order), "a store ended before the gateway resumed"
    finally:
        gateway.send_signal(signal.SIGCONT)
    assert all(plugin.wait(f)[1] is True for f in stores)
    assert plugin.wait(plugin.connector.submit_batch_exists([*crowd, "absent"]))[3] == [
        *[True] * len(crowd),
        False,
    ]  # the gateway answers, the key the table left out included


def test_close_with_ops_in_flight_reports_each_once_and_never_writes_l1_after(
    slow: FaultyGateway,
) -> None:
    plugin = Plugin(slow, op_timeout_s=30.0)
    stored = keyed_objects(6, 4, MiB)
    assert plugin.wait(plugin.store(stored))[1] is True
    for database in (0, 1):
        slow.inject(database=database, delay_s=1.0)
    mark = len(slow.log())
    buffers = [memoryview(bytearray(MiB)) for _ in stored]
    load = plugin.connector.submit_batch_get(list(stored), buffers)
    store = plugin.store(keyed_objects(7, 2, MiB))
    wait_until(lambda: "holding a read" in slow.log()[mark:], 10, "the gateway inside a load")

    plugin.close()  # LMCache's shutdown: what it gets back after this is its own again
    for buffer in buffers:
        buffer[:] = bytes([0x5A]) * MiB
    reported = plugin.connector.drain_completions()
    assert sorted(item[0] for item in reported) == sorted([load, store])
    assert all(len(item[3]) == (2 if item[0] == store else 4) for item in reported)
    assert all(item[1] is False for item in reported)
    slow.inject(clear=True)
    wait_until(lambda: "closed:" in slow.log()[mark:], 30, "the gateway to end the session")
    assert all(bytes(b) == bytes([0x5A]) * MiB for b in buffers), "L1 was written after close"


def test_loads_and_stores_together_leave_lookups_their_eighth_of_the_slots(
    workdir: Path, made: list[Plugin]
) -> None:
    """Loads may hold all but an eighth of a session's slots and stores half, but nothing kept
    the eighth: stores and then loads held every slot, and a lookup the presence table could
    not answer waited for one of them to end. Loads, stores and deletes together now leave an
    eighth of the slots free, so such a lookup is answered while both wait on a slow disk."""
    capacity = 512 * MiB
    (workdir / "gateway.yaml").write_text(
        "session_window_size: 64MiB\nsession_slots: 16\nfragment_size: 1MiB\n"
        "region_size: 8MiB\ndatabases_per_dir: 2\n"
    )
    slow = FaultyGateway(workdir, "512MiB", "--config", str(workdir / "gateway.yaml")).start()
    try:
        plugin = Plugin(slow, op_timeout_s=60.0, lookup_timeout_s=30.0)
        made.append(plugin)
        homes = keys_at_home(PROBES_MAX + 1, presence_slots_for(capacity), 0, "crowd-")
        crowd = {key: bytes([i]) * 4096 for i, key in enumerate(homes)}
        assert plugin.wait(plugin.store(crowd))[3] == [True] * len(crowd)
        held = keyed_objects(8, 16, MiB)
        assert plugin.wait(plugin.store(held))[3] == [True] * len(held)
        for database in (0, 1):
            slow.inject(database=database, delay_s=3.0)
        stores = [plugin.store({k: v}) for k, v in keyed_objects(9, 16, MiB).items()]
        into = [memoryview(bytearray(MiB)) for _ in held]
        loads = [
            plugin.connector.submit_batch_get([key], [view])
            for key, view in zip(held, into, strict=True)
        ]
        lookup = plugin.connector.submit_batch_exists(list(crowd))  # through the ring
        assert plugin.wait(lookup)[3] == [True] * len(crowd)
        assert not set(stores + loads) & set(plugin.order), "the lookup waited for a slot"
        slow.inject(clear=True)
        assert all(plugin.wait(f)[1] is True for f in stores + loads)
    finally:
        slow.kill()
