"""Goal: when LMCache's L1 is shared memory, stores of whole pages go from L1 to the disk with no
copy, every load comes back through the transfer window, and both of LMCache's promises hold:
no op outlives its deadline (plus the grace of a copy in progress), and the gateway never writes
an L1 buffer at all. The gateway reads L1 only, and a late read of a buffer LMCache reused is a
miss, never wrong bytes. No byte of L1 beyond an object reaches the disk.

The L1 here is a real POSIX shared-memory segment named as `lmcache server --shm-name` names
it, mapped in this process, where the real plugin finds it the way it does inside the server;
the gateway is a real process (with faulty databases where the test needs a slow one). The last
test runs the real `lmcache server --shm-name` with the plugin below it.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np
import pytest

from adp_wire.ring.layout import align_up
from lmcache_adp import ADPConnector
from tests.support import (
    BIN,
    Gateway,
    LMCacheServer,
    store_then_load_from_l2,
    wait_for_future,
    wait_until,
)
from tests.support.faulty_gateway import FaultyGateway
from tests.support.plugin import connected, keyed_objects

pytestmark = pytest.mark.integration
OP_TIMEOUT_S = 1.0
GRACE_S = 0.5  # the copy in progress at a deadline, and scheduling on a loaded two-core machine
PLANTED = bytes([0xEE]) * 64  # what LMCache's other objects hold, next to ours in L1


class SharedL1:
    """An L1 pool in a shared-memory segment, as `lmcache server --shm-name` makes one."""

    def __init__(self, size: int) -> None:
        name = f"lmcache_l1_pool_test{os.getpid()}_{time.monotonic_ns()}"
        self._segment = shared_memory.SharedMemory(name=name, create=True, size=size)
        self._segment.buf[:] = PLANTED * (size // len(PLANTED))
        self._used = 0
        self._views: list[memoryview] = []

    def buffer(self, nbytes: int, fill: int | None = 0xA5) -> memoryview:
        """A page-aligned buffer of ``nbytes``, like LMCache's allocator hands out; the rest
        of its last page, and the page after it, keep what other objects left there."""
        view = self._segment.buf[self._used : self._used + nbytes]
        self._views.append(view)
        self._used += align_up(nbytes) + 4096
        if fill is not None:
            view[:] = bytes([fill]) * nbytes
        return view

    def close(self) -> None:
        """Unmap and remove the segment (after the plugin that used it was closed)."""
        for view in self._views:
            view.release()
        self._segment.close()
        self._segment.unlink()


@pytest.fixture
def shared_l1() -> Iterator[SharedL1]:
    segment = SharedL1(256 * 2**20)
    yield segment
    segment.close()


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


def summary(gateway: Gateway, session: int = 1) -> tuple[int, int, int, int]:
    """Loads, hits, stores and zero-copy stores of a session, once it has closed."""
    pattern = re.compile(
        rf"session {session} \(.*closed: (\d+) loads \((\d+) hits.*?(\d+) stores.*?"
        r"(\d+) of the stores zero-copy"
    )
    wait_until(lambda: pattern.search(gateway.log()) is not None, 10, "the session summary")
    found = pattern.search(gateway.log())
    assert found is not None
    loads, hits, stores, zero_copy = map(int, found.groups())
    return loads, hits, stores, zero_copy


def test_whole_page_stores_go_from_shared_l1_to_disk_and_every_load_through_the_window(
    gateway: Gateway, shared_l1: SharedL1
) -> None:
    sizes = {"page": 4096, "three fragments": 9 * 2**20, "odd length": 2**20 + 123}
    batch = {f"{name}-{i}": data for i, (name, data) in enumerate(_random(sizes).items())}
    connector = plugin(gateway)
    assert store(connector, batch, [shared_l1.buffer(len(v)) for v in batch.values()])

    into = [shared_l1.buffer(len(v), fill=0) for v in batch.values()]
    assert load(connector, list(batch), into) == [True] * len(batch)
    assert [bytes(b) for b in into] == list(batch.values())

    connector.close()
    # Two of the three stores went zero-copy; the odd length went through the window, so no
    # byte of L1 beyond it was written; and all three loads came through the window.
    assert "(zero-copy to its L1)" in gateway.log()
    assert summary(gateway) == (3, 3, 3, 2)

    # Either path reads what the other wrote: the gateway took the checksums on both.
    copying = plugin(gateway, zero_copy=False)
    private = [memoryview(bytearray(len(v))) for v in batch.values()]
    assert load(copying, list(batch), private) == [True] * len(batch)
    assert [bytes(b) for b in private] == list(batch.values())
    copying.close()


HINT = "copy path: L1 is private memory; `lmcache server --shm-name NAME --no-l1-use-lazy`"


def test_the_plugin_says_which_path_its_stores_take_and_how_to_make_them_zero_copy(
    gateway: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    """Which path the stores take, in the connected line: with L1 private here, the gateway
    copies them out of this process (test_remote_copy.py); with that off too, the copy path. The
    advice to put L1 in shared memory goes only where it applies (a real `lmcache server` with
    private L1 and no remote copy, the next test), never when L1 is in shared memory."""
    caplog.set_level(logging.INFO, logger="lmcache_adp")
    plugin(gateway).close()  # no L1 segment is mapped in this process
    assert "(remote copy)" in caplog.text and HINT not in caplog.text
    caplog.clear()
    plugin(gateway, zero_copy=False, remote_copy=False).close()
    assert "copy path)" in caplog.text and HINT not in caplog.text
    caplog.clear()
    segment = SharedL1(2**20)
    try:
        plugin(gateway).close()
    finally:
        segment.close()
    assert "zero-copy stores from L1)" in caplog.text and HINT not in caplog.text


def test_the_advice_on_private_l1_goes_to_a_server_and_never_to_a_bench_client(
    gateway: Gateway, make_server: Callable[..., LMCacheServer], workdir: Path
) -> None:
    """`lmcache bench l2` (scripts/smoke.sh) makes the adapter over buffers of its own: there
    is no `--shm-name` to give it, so the advice would only say, wrongly, that the served stack
    is not zero-copy. A real `lmcache server` with private L1 whose stores the plugin copies
    (remote copy off here) gets it."""
    out = workdir / "bench.json"
    spec = gateway.l2_adapter_json(remote_copy=False)
    bench = subprocess.run(
        [
            str(BIN / "lmcache"), "bench", "l2", "--l2-adapter", spec,
            "--num-keys", "2", "--data-size-kb", "256", "--rounds", "1", "--warmup-rounds", "0",
            "--l1-align-bytes", "4096", "--format", "json", "--output", str(out),
        ],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    said = bench.stdout + bench.stderr
    assert bench.returncode == 0, said[-3000:]
    assert "connected to the gateway" in said and "copy path)" in said, said[-3000:]
    assert HINT not in said

    server = make_server(spec).start()
    wait_until(lambda: "connected to the gateway" in server.log(), 30, "the plugin to connect")
    assert HINT in server.log()


def test_no_byte_of_l1_beyond_an_object_reaches_the_disk(
    gateway: Gateway, shared_l1: SharedL1
) -> None:
    sizes = {"whole pages": 3 * 4096, "odd": 5000, "one byte": 1, "odd fragments": 9 * 2**20 + 7}
    batch = _random(sizes)
    connector = plugin(gateway)
    assert store(connector, batch, [shared_l1.buffer(len(v)) for v in batch.values()])
    connector.close()
    gateway.stop()  # sealed and synced: every record is on disk
    assert PLANTED not in (gateway.data_dir / "db0.adp").read_bytes()


def test_a_store_given_up_while_the_gateway_writes_it_is_never_published(
    slow: FaultyGateway, shared_l1: SharedL1
) -> None:
    batch = keyed_objects(5, 1, 2**20)
    connector = plugin(slow, op_timeout_s=OP_TIMEOUT_S)
    for database in (0, 1):
        slow.inject(database=database, delay_s=OP_TIMEOUT_S + 1.0)
    buffer = shared_l1.buffer(2**20)
    mark = len(slow.log())
    started = time.monotonic()
    # The gateway takes the store and waits on its disk past the deadline: the plugin reports
    # the store failed on time, and LMCache reuses the buffer at once.
    assert store(connector, batch, [buffer]) is False
    assert time.monotonic() - started < OP_TIMEOUT_S + GRACE_S
    buffer[:] = bytes([0x5A]) * len(buffer)
    slow.inject(clear=True)
    # The late write carried the new bytes to disk under the old checksums. The gateway asks the
    # store's given-up word again once written, and deletes the version instead of publishing
    # it: EXISTS never finds what every load would miss.
    wait_until(lambda: "up while it was written" in slow.log()[mark:], 10, "the write given up")
    assert run(connector, connector.submit_batch_exists(list(batch)))[1] == [False]
    into = shared_l1.buffer(2**20, fill=0)
    assert load(connector, list(batch), [into]) == [False]
    assert bytes(into) == bytes(len(into))
    connector.close()
    # Nor does a restart find it: the version was deleted, not only left out of the index.
    slow.restart()
    again = plugin(slow, op_timeout_s=OP_TIMEOUT_S)
    assert run(again, again.submit_batch_exists(list(batch))) == (True, [False])
    again.close()


def test_a_store_given_up_while_the_gateway_reads_it_is_never_written(
    slow: FaultyGateway, shared_l1: SharedL1
) -> None:
    batch = keyed_objects(12, 1, 2**20)
    connector = plugin(slow, op_timeout_s=OP_TIMEOUT_S)
    slow.inject(checksum_delay_s=OP_TIMEOUT_S + 1.0)
    buffer = shared_l1.buffer(2**20)
    mark = len(slow.log())
    started = time.monotonic()
    # The gateway starts the store in time, and is still taking its checksums from L1 when the
    # deadline passes: the plugin sets the store's given-up word and reports it failed on time,
    # and LMCache rewrites the buffer at once, before the gateway's checksums read it.
    assert store(connector, batch, [buffer]) is False
    assert time.monotonic() - started < OP_TIMEOUT_S + GRACE_S
    assert "holding a checksum" in slow.log()[mark:]
    buffer[:] = bytes([0x5A]) * len(buffer)
    # Its checksums match the rewritten bytes, so only the word keeps them off the disk: the
    # gateway reads it next and gives the store up.
    wait_until(lambda: "gave the store of" in slow.log()[mark:], 10, "the store given up")
    slow.inject(clear=True)
    assert run(connector, connector.submit_batch_exists(list(batch)))[1] == [False]
    into = shared_l1.buffer(2**20, fill=0)
    assert load(connector, list(batch), [into]) == [False]
    assert bytes(into) == bytes(len(into))
    connector.close()


def test_an_object_corrupted_on_disk_is_a_miss_and_is_dropped(
    gateway: Gateway, shared_l1: SharedL1
) -> None:
    batch = keyed_objects(7, 2, 64 * 2**10)
    connector = plugin(gateway)
    assert store(connector, batch, [shared_l1.buffer(len(v)) for v in batch.values()])
    connector.close()
    gateway.stop()
    data = next(iter(batch.values()))
    image = gateway.data_dir / "db0.adp"
    at = image.read_bytes().index(data[:4096]) + 1000
    with open(image, "r+b") as f:
        f.seek(at)
        f.write(bytes([data[1000] ^ 0x01]))
    gateway.start()

    connector = plugin(gateway)
    into = [shared_l1.buffer(len(v), fill=0) for v in batch.values()]
    assert load(connector, list(batch), into) == [False, True]
    assert bytes(into[0]) == bytes(len(into[0]))  # nothing of the damaged object reached L1
    assert bytes(into[1]) == list(batch.values())[1]
    assert run(connector, connector.submit_batch_exists(list(batch)))[1] == [False, True]
    connector.close()


@pytest.fixture
def slow(workdir: Path) -> Iterator[FaultyGateway]:
    config = workdir / "gateway.yaml"
    config.write_text("region_size: 8MiB\nfragment_size: 1MiB\ndatabases_per_dir: 2\n")
    gateway = FaultyGateway(workdir, "256MiB", "--config", str(config))
    yield gateway.start()  # type: ignore[misc]
    gateway.kill()


def test_ops_settle_on_time_with_the_gateway_stopped_mid_move_and_l1_is_never_written(
    slow: FaultyGateway, shared_l1: SharedL1
) -> None:
    stored, fresh = keyed_objects(9, 1, 2**20), keyed_objects(10, 1, 2**20)
    connector = plugin(slow, op_timeout_s=OP_TIMEOUT_S)
    assert store(connector, stored, [shared_l1.buffer(2**20)])
    loading = shared_l1.buffer(2**20, fill=0)
    storing = shared_l1.buffer(2**20)
    storing[:] = next(iter(fresh.values()))
    for database in (0, 1):
        slow.inject(database=database, delay_s=0.3)
    mark = len(slow.log())
    started = time.monotonic()
    load_id = connector.submit_batch_get(list(stored), [loading])
    store_id = connector.submit_batch_set(list(fresh), [storing])
    wait_until(lambda: "holding a read" in slow.log()[mark:], 10, "the gateway inside the load")
    slow.send_signal(signal.SIGSTOP)
    try:
        assert run(connector, load_id) == (False, [False])
        assert run(connector, store_id)[0] is False
        assert time.monotonic() - started < OP_TIMEOUT_S + GRACE_S
        loading[:] = storing[:] = bytes([0x5A]) * len(loading)  # LMCache reuses both at once
    finally:
        slow.send_signal(signal.SIGCONT)
    slow.inject(clear=True)
    # The resumed gateway finishes its I/O (into the window, and from L1 for the store); once
    # the session has closed, it has let go of everything. L1 was never written: both buffers
    # hold what LMCache put there after the report.
    connector.close()
    summary(slow)
    assert bytes(loading) == bytes(storing) == bytes([0x5A]) * len(loading)


def test_a_gateway_killed_mid_load_releases_its_ops_at_once(
    slow: FaultyGateway, shared_l1: SharedL1
) -> None:
    batch = keyed_objects(11, 1, 256 * 2**10)
    connector = plugin(slow, op_timeout_s=30.0)
    assert store(connector, batch, [shared_l1.buffer(len(v)) for v in batch.values()])
    for database in (0, 1):
        slow.inject(database=database, delay_s=60)
    into = shared_l1.buffer(256 * 2**10, fill=0)
    mark = len(slow.log())
    future_id = connector.submit_batch_get(list(batch), [into])
    wait_until(lambda: "holding a read" in slow.log()[mark:], 10, "the gateway inside the load")
    slow.kill()  # the plugin sees EOF at once: it need not wait for the deadline
    started = time.monotonic()
    assert run(connector, future_id) == (False, [False])
    assert time.monotonic() - started < GRACE_S * 4
    assert bytes(into) == bytes(len(into))
    connector.close()


def test_a_session_whose_zero_copy_write_is_stuck_in_the_kernel_still_closes(
    workdir: Path, shared_l1: SharedL1
) -> None:
    """An O_DIRECT write from L1 that the kernel holds (a lost NVMe-oF path; here a database
    stalled for 30 s) used to keep its session from closing: closing waited for the write, so
    the session kept its place under `max_sessions` and no other client could connect. Now
    the session closes at once and its socket (the client's sign that the gateway let go of
    its L1) closes when the write ends."""
    config = workdir / "gateway.yaml"
    config.write_text("region_size: 8MiB\nfragment_size: 1MiB\nmax_sessions: 1\n")
    gateway = FaultyGateway(workdir, "256MiB", "--config", str(config)).start()
    try:
        first = plugin(gateway, op_timeout_s=OP_TIMEOUT_S)
        gateway.inject(database=0, delay_s=30)
        mark = len(gateway.log())
        first.submit_batch_set(["stuck"], [shared_l1.buffer(2**20)])
        wait_until(lambda: "holding a write" in gateway.log()[mark:], 10, "the stuck write")
        first.close()  # waits op_timeout_s for the gateway's EOF, then closes anyway
        wait_until(lambda: "closed:" in gateway.log(), 10, "the first session to close")
        second = plugin(gateway)  # the one place under max_sessions is free again
        assert "still being read from the client's L1" in gateway.log()
        second.close()
    finally:
        gateway.kill()


def test_lmcache_server_with_l1_in_shared_memory_stores_zero_copy(
    gateway: Gateway, make_server: Callable[..., LMCacheServer]
) -> None:
    server = make_server(gateway.l2_adapter_json(), shm_name=f"adp{os.getpid()}").start()
    store_then_load_from_l2(server, seed=3, chunks="4")
    server.stop()
    loads, hits, stores, zero_copy = summary(gateway)
    assert "(zero-copy to its L1)" in gateway.log()
    assert hits == loads >= 4 and stores == 4 and zero_copy == stores


def _random(sizes: dict[str, int]) -> dict[str, bytes]:
    rng = np.random.default_rng(12)
    return {name: rng.integers(0, 256, n, dtype=np.uint8).tobytes() for name, n in sizes.items()}
