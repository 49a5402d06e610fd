"""Goal: when LMCache's L1 is shared memory, objects move between the disk and L1 with no copy,
and invariant 4 holds: once the plugin has reported an op, the gateway never touches its buffer.

The L1 here is a real POSIX shared-memory segment named as `lmcache server --shm-name` names
it, mapped in this process, where the real plugin finds it the way it does inside the server;
the gateway is a real process (with faulty databases where the test needs a slow one). The last
test runs the real `lmcache server --shm-name` with the plugin below it.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np
import pytest

from gateway.ring.layout import align_up
from lmcache_adp import ADPConnector
from tests.integration.test_gateway_faults import FaultyGateway, objects
from tests.integration.test_mp_server import store_then_load_from_l2
from tests.support import Gateway, LMCacheServer, wait_for_future, wait_until
from tests.unit.test_connector import connected

pytestmark = pytest.mark.integration
OP_TIMEOUT_S = 1.0
SLACK_S = 2.0  # scheduling noise on a loaded two-core machine


class SharedL1:
    """An L1 pool in a shared-memory segment, as `lmcache server --shm-name` makes one."""

    def __init__(self, size: int) -> None:
        name = f"lmcache_l1_pool_test{os.getpid()}_{time.monotonic_ns()}"
        self._segment = shared_memory.SharedMemory(name=name, create=True, size=size)
        self._used = 0

    def buffer(self, nbytes: int, fill: int = 0xA5) -> memoryview:
        """A page-aligned buffer of ``nbytes``, like LMCache's allocator hands out."""
        view = self._segment.buf[self._used : self._used + nbytes]
        self._used += align_up(nbytes)
        view[:] = bytes([fill]) * nbytes
        return view

    def unlink(self) -> None:
        self._segment.unlink()  # the mapping stays until the views die; find() ignores it


@pytest.fixture
def shared_l1() -> Iterator[SharedL1]:
    segment = SharedL1(256 * 2**20)
    yield segment
    segment.unlink()


def run(connector: ADPConnector, future_id: int) -> tuple[bool, list[bool]]:
    item = wait_for_future(connector, future_id, timeout_s=60)
    return bool(item[1]), list(item[3])


def store(connector: ADPConnector, batch: dict[str, bytes], buffers: list[memoryview]) -> bool:
    for buffer, data in zip(buffers, batch.values(), strict=True):
        buffer[:] = data
    return run(connector, connector.submit_batch_set(list(batch), buffers))[0]


def load(connector: ADPConnector, keys: list[str], buffers: list[memoryview]) -> list[bool]:
    return run(connector, connector.submit_batch_get(keys, buffers))[1]


def plugin(gateway: Gateway, **params: object) -> ADPConnector:
    connector = ADPConnector(**gateway.adapter_params(**params))
    connected(connector)
    return connector


def test_objects_move_between_the_disk_and_a_shared_l1_without_copies(
    gateway: Gateway, shared_l1: SharedL1
) -> None:
    sizes = {"page": 4096, "three fragments": 9 * 2**20, "odd length": 2**20 + 123}
    batch = {f"{name}-{i}": data for i, (name, data) in enumerate(_random(sizes).items())}
    connector = plugin(gateway)
    assert store(connector, batch, [shared_l1.buffer(len(v)) for v in batch.values()])

    into = [shared_l1.buffer(len(v)) for v in batch.values()]
    assert load(connector, list(batch), into) == [True] * len(batch)
    assert [bytes(b) for b in into] == list(batch.values())

    # Either path reads what the other wrote: the plugin's checksums are the gateway's.
    copying = plugin(gateway, zero_copy=False)
    private = [memoryview(bytearray(len(v))) for v in batch.values()]
    assert load(copying, list(batch), private) == [True] * len(batch)
    assert [bytes(b) for b in private] == list(batch.values())
    again = {f"copied-{k}": v for k, v in batch.items()}
    assert store(copying, again, [memoryview(bytearray(len(v))) for v in again.values()])
    copying.close()
    into = [shared_l1.buffer(len(v), fill=0) for v in again.values()]
    assert load(connector, list(again), into) == [True] * len(again)
    assert [bytes(b) for b in into] == list(again.values())
    connector.close()

    # 3 stores and 4 of the 6 loads went zero-copy; a load of an odd length fills whole pages
    # on the disk side, so it takes the copy path.
    wait_until(lambda: "of the loads and stores zero-copy" in gateway.log(), 10, "the summary")
    assert "(zero-copy to its L1)" in gateway.log()
    assert "found), 7 of the loads and stores zero-copy" in gateway.log()


def test_an_object_corrupted_on_disk_is_a_miss_in_l1_and_is_dropped(
    gateway: Gateway, shared_l1: SharedL1, caplog: pytest.LogCaptureFixture
) -> None:
    batch = objects(7, 2, 64 * 2**10)
    connector = plugin(gateway)
    assert store(connector, batch, [shared_l1.buffer(len(v)) for v in batch.values()])
    connector.close()
    gateway.stop()
    victim, data = next(iter(batch.items()))
    image = gateway.data_dir / "db0.adp"
    at = image.read_bytes().index(data[:4096]) + 1000
    with open(image, "r+b") as f:
        f.seek(at)
        f.write(bytes([data[1000] ^ 0x01]))
    gateway.start()

    connector = plugin(gateway)
    into = [shared_l1.buffer(len(v), fill=0) for v in batch.values()]
    assert load(connector, list(batch), into) == [False, True]
    assert bytes(into[1]) == list(batch.values())[1]
    assert f"{victim} failed its checksum in L1" in caplog.text
    wait_until(  # the plugin has the gateway drop it, so no later lookup finds it
        lambda: run(connector, connector.submit_batch_exists(list(batch)))[1] == [False, True],
        10,
        "the corrupt object to be dropped",
    )
    connector.close()


@pytest.fixture
def slow(workdir: Path) -> Iterator[FaultyGateway]:
    config = workdir / "gateway.yaml"
    config.write_text("region_size: 8MiB\nfragment_size: 1MiB\ndatabases_per_dir: 2\n")
    gateway = FaultyGateway(workdir, "256MiB", "--config", str(config))
    yield gateway.start()  # type: ignore[misc]
    gateway.kill()


def test_a_load_still_moving_at_its_deadline_is_reported_when_the_move_ends(
    slow: FaultyGateway, shared_l1: SharedL1
) -> None:
    batch = objects(8, 1, 256 * 2**10)
    connector = plugin(slow, op_timeout_s=OP_TIMEOUT_S)
    assert store(connector, batch, [shared_l1.buffer(len(v)) for v in batch.values()])
    for database in (0, 1):
        slow.inject(database=database, delay_s=OP_TIMEOUT_S + 1.5)

    # The gateway is inside the load (its fence is up) when the deadline passes: reporting then
    # would hand LMCache a buffer the disk is about to write. So the plugin waits, and the load
    # ends late but whole.
    into = [shared_l1.buffer(len(v), fill=0) for v in batch.values()]
    assert load(connector, list(batch), into) == [True]
    assert bytes(into[0]) == next(iter(batch.values()))

    # On the copy path the gateway never touches L1, so the same load is reported at its
    # deadline, as a miss.
    copying = plugin(slow, op_timeout_s=OP_TIMEOUT_S, zero_copy=False)
    assert load(copying, list(batch), [memoryview(bytearray(256 * 2**10))]) == [False]
    copying.close()
    connector.close()


def test_ops_a_hung_gateway_has_not_started_expire_on_time_and_are_never_touched(
    gateway: Gateway, shared_l1: SharedL1
) -> None:
    stored, fresh = objects(9, 1, 128 * 2**10), objects(10, 1, 128 * 2**10)
    connector = plugin(gateway, op_timeout_s=OP_TIMEOUT_S)
    assert store(connector, stored, [shared_l1.buffer(len(v)) for v in stored.values()])
    loading = shared_l1.buffer(128 * 2**10, fill=0)
    storing = shared_l1.buffer(128 * 2**10)
    storing[:] = next(iter(fresh.values()))

    gateway.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        load_id = connector.submit_batch_get(list(stored), [loading])
        store_id = connector.submit_batch_set(list(fresh), [storing])
        assert run(connector, load_id) == (False, [False])
        assert run(connector, store_id)[0] is False
        assert time.monotonic() - started < OP_TIMEOUT_S + SLACK_S
        # LMCache reuses both buffers at once.
        loading[:] = storing[:] = bytes([0x5A]) * len(loading)
    finally:
        gateway.send_signal(signal.SIGCONT)

    # The resumed gateway finds both ops past their deadlines and leaves L1 alone: the load
    # wrote nothing, the store stored nothing.
    assert run(connector, connector.submit_batch_exists([*stored, *fresh]))[1] == [True, False]
    assert bytes(loading) == bytes(storing) == bytes([0x5A]) * len(loading)
    connector.close()


def test_a_gateway_killed_mid_move_releases_its_ops_at_once(
    slow: FaultyGateway, shared_l1: SharedL1
) -> None:
    batch = objects(11, 1, 256 * 2**10)
    connector = plugin(slow, op_timeout_s=30.0)
    assert store(connector, batch, [shared_l1.buffer(len(v)) for v in batch.values()])
    for database in (0, 1):
        slow.inject(database=database, delay_s=60)
    into = shared_l1.buffer(256 * 2**10, fill=0)
    future_id = connector.submit_batch_get(list(batch), [into])
    time.sleep(0.5)  # the gateway is inside the load now, waiting on its disk
    slow.kill()  # a dead process touches nothing: the plugin need not wait for the deadline
    started = time.monotonic()
    assert run(connector, future_id) == (False, [False])
    assert time.monotonic() - started < SLACK_S
    assert bytes(into) == bytes(len(into))
    connector.close()


def test_lmcache_server_with_l1_in_shared_memory_restores_through_zero_copy(
    gateway: Gateway, make_server: Callable[..., LMCacheServer]
) -> None:
    server = make_server(gateway.l2_adapter_json(), shm_name=f"adp{os.getpid()}").start()
    store_then_load_from_l2(server, seed=3, chunks="4")
    server.stop()
    wait_until(lambda: SUMMARY.search(gateway.log()) is not None, 10, "the session summary")
    match = SUMMARY.search(gateway.log())
    assert match is not None and "(zero-copy to its L1)" in gateway.log()
    loads, hits, stores, zero_copy = map(int, match.groups())
    assert hits == loads >= 4 and stores == 4 and zero_copy == loads + stores


SUMMARY = re.compile(
    r"closed: (\d+) loads \((\d+) hits.*?(\d+) stores.*?(\d+) of the loads and stores zero-copy"
)


def _random(sizes: dict[str, int]) -> dict[str, bytes]:
    rng = np.random.default_rng(12)
    return {name: rng.integers(0, 256, n, dtype=np.uint8).tobytes() for name, n in sizes.items()}
