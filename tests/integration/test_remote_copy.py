"""Goal: when LMCache's L1 is private memory, the gateway copies each store out of it itself (remote
copy, adp_gateway/sessions/client_process.py), so no store is copied inside LMCache's process, and
both of LMCache's promises hold: no op outlives its deadline, and a store LMCache gave up and reused
is never written. The gateway only reads the client; loads land in the window and are copied into L1
by the plugin.

The plugin runs in this process, with its buffers in this process's private memory as LMCache's L1
is; the gateway is a real process (with a slow copy on command where the test needs one). The last
test runs a real `lmcache server` as LMCache's docs launch it (no --shm-name)."""

from __future__ import annotations

import itertools
import logging
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from adp_gateway.observe.status import ask, render
from adp_gateway.scheduling.io_threads import HELD_S
from adp_gateway.service import EXPIRE_INTERVAL_S
from lmcache_adp import ADPConnector
from tests.support import (
    Gateway,
    LMCacheServer,
    store_then_load_from_l2,
    wait_for_future,
    wait_until,
)
from tests.support.faulty_gateway import FaultyGateway
from tests.support.plugin import connected, keyed_objects
from tests.support.stalled_memory import StalledMemory

pytestmark = pytest.mark.integration
OP_TIMEOUT_S = 1.0
GRACE_S = 0.5  # the copy in progress at a deadline, and scheduling on a loaded two-core machine


@pytest.fixture
def slow(workdir: Path) -> Iterator[FaultyGateway]:
    config = workdir / "gateway.yaml"
    config.write_text("region_size: 8MiB\nfragment_size: 1MiB\ndatabases_per_dir: 2\n")
    gateway = FaultyGateway(workdir, "256MiB", "--config", str(config))
    yield gateway.start()  # type: ignore[misc]
    gateway.kill()


def plugin(gateway: Gateway, **params: object) -> ADPConnector:
    connector = ADPConnector(**gateway.adapter_params(**params))
    connected(connector)
    return connector


def run(connector: ADPConnector, future_id: int) -> tuple[bool, list[bool]]:
    item = wait_for_future(connector, future_id, timeout_s=60)
    return bool(item[1]), list(item[3])


def stores_copied_by_the_gateway(gateway: Gateway, session: int = 1) -> tuple[int, int]:
    """A closed session's stores, and those the gateway copied out of the client itself."""
    pattern = re.compile(
        rf"session {session} \(.*closed: .*?(\d+) stores .*?(\d+) copied by the gateway"
    )
    wait_until(lambda: pattern.search(gateway.log()) is not None, 10, "the session summary")
    found = pattern.search(gateway.log())
    assert found is not None
    stores, copied = map(int, found.groups())
    return stores, copied


def test_stores_from_private_memory_are_copied_by_the_gateway_and_load_back_exact(
    gateway: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    """Objects of any length (an odd one too: the gateway pads it, not the plugin) are read
    out of this process by the gateway and come back byte-exact; the plugin's connected line
    and the gateway's say which path the stores take."""
    caplog.set_level(logging.INFO, logger="lmcache_adp")
    batch = keyed_objects(21, 3, 3 * 2**20 + 17)
    connector = plugin(gateway)
    values = [bytearray(v) for v in batch.values()]
    assert run(connector, connector.submit_batch_set(list(batch), list(map(memoryview, values))))
    for value in values:  # LMCache reuses the buffers once the store is reported
        value[:] = bytes(len(value))
    into = [bytearray(len(v)) for v in batch.values()]
    found = run(connector, connector.submit_batch_get(list(batch), list(map(memoryview, into))))
    assert found == (True, [True] * 3)
    assert [bytes(b) for b in into] == list(batch.values())
    connector.close()
    assert stores_copied_by_the_gateway(gateway) == (3, 3)
    assert "(remote copy from its memory)" in gateway.log()
    assert "the gateway copies stores out of L1 itself (remote copy)" in caplog.text


def test_with_remote_copy_off_the_plugin_copies_its_stores(gateway: Gateway) -> None:
    batch = keyed_objects(22, 2, 2**20)
    connector = plugin(gateway, remote_copy=False)
    buffers = [memoryview(bytearray(v)) for v in batch.values()]
    assert run(connector, connector.submit_batch_set(list(batch), buffers))[0]
    connector.close()
    assert stores_copied_by_the_gateway(gateway) == (2, 0)


def test_a_store_given_up_while_the_gateway_copies_it_is_never_written(
    slow: FaultyGateway,
) -> None:
    """The gateway starts the copy in time and is still copying when the deadline passes: the
    plugin sets the store's given-up word and reports it failed on time, and LMCache rewrites
    the buffer at once. The gateway finds the word set after its copy and writes nothing."""
    batch = keyed_objects(23, 1, 2**20)
    connector = plugin(slow, op_timeout_s=OP_TIMEOUT_S)
    slow.inject(checksum_delay_s=OP_TIMEOUT_S + 1.0)
    buffer = bytearray(next(iter(batch.values())))
    mark = len(slow.log())
    started = time.monotonic()
    assert run(connector, connector.submit_batch_set(list(batch), [memoryview(buffer)]))[0] is False
    assert time.monotonic() - started < OP_TIMEOUT_S + GRACE_S
    assert "holding a checksum" in slow.log()[mark:]
    buffer[:] = bytes([0x5A]) * len(buffer)
    wait_until(lambda: "gave the store of" in slow.log()[mark:], 10, "the store given up")
    slow.inject(clear=True)
    assert run(connector, connector.submit_batch_exists(list(batch)))[1] == [False]
    into = bytearray(len(buffer))
    assert run(connector, connector.submit_batch_get(list(batch), [memoryview(into)]))[1] == [False]
    connector.close()


def test_ops_settle_on_time_with_the_gateway_stopped_mid_copy(slow: FaultyGateway) -> None:
    """A gateway stopped while it copies a store out of this process costs that store its
    deadline, no more; once it runs again it writes nothing LMCache has reused."""
    batch = keyed_objects(24, 1, 2**20)
    connector = plugin(slow, op_timeout_s=OP_TIMEOUT_S)
    slow.inject(checksum_delay_s=0.3)
    buffer = bytearray(next(iter(batch.values())))
    mark = len(slow.log())
    started = time.monotonic()
    future_id = connector.submit_batch_set(list(batch), [memoryview(buffer)])
    wait_until(lambda: "holding a checksum" in slow.log()[mark:], 10, "the gateway in the copy")
    slow.send_signal(signal.SIGSTOP)
    try:
        assert run(connector, future_id)[0] is False
        assert time.monotonic() - started < OP_TIMEOUT_S + GRACE_S
        buffer[:] = bytes([0x5A]) * len(buffer)  # LMCache reuses it at once
    finally:
        slow.send_signal(signal.SIGCONT)
    wait_until(lambda: "gave the store of" in slow.log()[mark:], 10, "the store given up")
    slow.inject(clear=True)
    assert run(connector, connector.submit_batch_exists(list(batch)))[1] == [False]
    connector.close()


def test_a_client_whose_memory_never_answers_holds_only_its_share_of_the_io_threads(
    make_gateway: Callable[..., Gateway], workdir: Path
) -> None:
    """Stores whose L1 pages never answer the gateway's reads (here: registered with
    userfaultfd and never served) hold the I/O threads that read them until the pages answer.
    They hold at most three of the four, so another client still stores and loads on time; the
    stalled ones fail at their deadline and are never written."""
    stalled = StalledMemory(8 * 2**20)
    config = workdir / "gateway.yaml"
    config.write_text("io_threads: 4\n")
    gateway = make_gateway("256MiB", "--config", str(config)).start()
    stuck = plugin(gateway, op_timeout_s=OP_TIMEOUT_S)
    other = plugin(gateway, op_timeout_s=OP_TIMEOUT_S)
    try:
        keys = list(keyed_objects(25, 8, 2**20))
        buffers = [stalled.memory[i * 2**20 : (i + 1) * 2**20] for i in range(len(keys))]
        stuck_id = stuck.submit_batch_set(keys, buffers)
        wait_until(lambda: at_share(gateway) == 1, 10, "the stalled session at its share")
        assert "holding every I/O thread they may: 1 session" in render(
            ask(str(gateway.socket_path))
        )
        stores_and_loads(other, seed=26)
        assert run(stuck, stuck_id)[0] is False
    finally:
        stalled.release()
    # the three that held their threads read zeros now, find the store given up, write nothing
    wait_until(lambda: gateway.log().count("gave the store of") == 3, 10, "the stalled stores")
    assert at_share(gateway) == 0
    assert run(stuck, stuck.submit_batch_exists(keys))[1] == [False] * len(keys)
    stuck.close()
    other.close()


def test_three_clients_whose_memory_never_answers_cost_the_others_nothing(
    make_gateway: Callable[..., Gateway], workdir: Path
) -> None:
    """Three such clients could hold three of the four I/O threads each: nine of four. Once
    their stores have held the threads for a second, others start beside them (one for each
    held), so another client still stores and loads; when the pages answer, the threads go
    back to io_threads."""
    stalled = [StalledMemory(8 * 2**20) for _ in range(3)]
    config = workdir / "gateway.yaml"
    config.write_text("io_threads: 4\n")
    gateway = make_gateway("256MiB", "--config", str(config)).start()
    stuck = [plugin(gateway, op_timeout_s=OP_TIMEOUT_S) for _ in stalled]
    other = plugin(gateway, op_timeout_s=OP_TIMEOUT_S)
    try:
        seeds = itertools.count(100)

        def stalled_clients_store() -> bool:
            """Each stalled client stores again, as its next requests would: its stores that
            waited for a thread have expired by the time more threads start."""
            for client, memory in zip(stuck, stalled, strict=True):
                keys = list(keyed_objects(next(seeds), 8, 2**20))
                buffers = [memory.memory[i * 2**20 : (i + 1) * 2**20] for i in range(len(keys))]
                client.submit_batch_set(keys, buffers)
            time.sleep(HELD_S + 5 * EXPIRE_INTERVAL_S)  # held, and new threads started
            return io_threads(gateway)["held"] == 9

        wait_until(stalled_clients_store, 30, "each client's share held")
        wait_until(lambda: io_threads(gateway)["alive"] == 13, 10, "nine more beside them")
        assert "I/O threads: 13 alive for io_threads 4" in render(ask(str(gateway.socket_path)))
        stores_and_loads(other, seed=32)
    finally:
        for memory in stalled:
            memory.release()
    wait_until(lambda: io_threads(gateway)["alive"] == 4, 10, "the threads back to io_threads")
    for client in [*stuck, other]:
        client.close()


def stores_and_loads(client: ADPConnector, seed: int) -> None:
    """Two objects of 1 MiB stored and loaded back, each op within the client's deadline."""
    batch = keyed_objects(seed, 2, 2**20)
    values = [memoryview(bytearray(v)) for v in batch.values()]
    assert run(client, client.submit_batch_set(list(batch), values))[0]
    into = [bytearray(2**20) for _ in batch]
    found = run(client, client.submit_batch_get(list(batch), list(map(memoryview, into))))
    assert found == (True, [True, True])
    assert [bytes(b) for b in into] == list(batch.values())


def io_threads(gateway: Gateway) -> dict[str, int]:
    """The I/O threads alive and held, as `adp-gateway status` reads them."""
    return dict(ask(str(gateway.socket_path))["io_threads"])


def at_share(gateway: Gateway) -> int:
    """The sessions holding every I/O thread they may, as `adp-gateway status` reads them."""
    return int(ask(str(gateway.socket_path))["at_io_thread_share"]["sessions"])


def test_lmcache_server_with_private_l1_has_the_gateway_copy_its_stores(
    gateway: Gateway, make_server: Callable[..., LMCacheServer]
) -> None:
    server = make_server(gateway.l2_adapter_json()).start()  # no --shm-name: private L1
    store_then_load_from_l2(server, seed=5, chunks="4")
    server.stop()
    stores, copied = stores_copied_by_the_gateway(gateway)
    assert stores == copied == 4
