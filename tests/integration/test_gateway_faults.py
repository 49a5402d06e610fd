"""Goal: what storage does wrong costs only the ops it touches. A real gateway process whose
databases fail on command (tests/support/faulty_gateway.py) serves a real plugin: disk errors
(EIO on read or write), a full disk (ENOSPC), latency spikes and stalls of seconds. Every failing
op completes as a failure or a miss within its deadline, the gateway keeps serving everything
else, and nothing already stored is lost or corrupted: after the faults, and after a restart,
every acknowledged object loads byte-exact and `adp-gateway check` finds no damage. A byte
corrupted on disk is a miss with a log line, and `adp-gateway check` names its object."""

from __future__ import annotations

import errno
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from adp_gateway.service import CLOSE_WAIT_S, STOP_IO_WAIT_S
from lmcache_adp import ADPConnector
from tests.support import BIN, Gateway, wait_for_future, wait_until
from tests.support.faulty_gateway import FaultyGateway
from tests.support.plugin import Objects, connected, databases_of, keyed_objects

pytestmark = pytest.mark.integration
FRAGMENT_BYTES = 2**20
OP_TIMEOUT_S = 2.0
SLACK_S = 1.5  # scheduling noise on a loaded two-core machine
CONFIG = "region_size: 8MiB\nfragment_size: 1MiB\ndatabases_per_dir: 2\nio_threads: 8\n"


class Client:
    def __init__(self, gateway: Gateway) -> None:
        params = gateway.adapter_params(op_timeout_s=OP_TIMEOUT_S, reconnect_interval_s=0.2)
        self.connector = ADPConnector(**params)
        connected(self.connector)

    def _run(self, future_id: int) -> tuple[bool, list[bool]]:
        started = time.monotonic()
        item = wait_for_future(self.connector, future_id)
        took = time.monotonic() - started
        assert took < OP_TIMEOUT_S + SLACK_S, f"an op took {took:.1f} s"
        return bool(item[1]), list(item[3])

    def store(self, batch: Objects) -> list[bool]:
        views = [memoryview(bytearray(v)) for v in batch.values()]
        return self._run(self.connector.submit_batch_set(list(batch), views))[1]

    def load(self, batch: Objects) -> list[bool]:
        """Load every key; a hit must be byte-exact."""
        out = [bytearray(len(v)) for v in batch.values()]
        hits = self._run(
            self.connector.submit_batch_get(list(batch), [memoryview(b) for b in out])
        )[1]
        for (key, data), got, hit in zip(batch.items(), out, hits, strict=True):
            assert not hit or bytes(got) == data, f"wrong bytes for {key}"
        return hits

    def exists(self, keys: list[str]) -> list[bool]:
        return self._run(self.connector.submit_batch_exists(keys))[1]

    def close(self) -> None:
        self.connector.close()


@pytest.fixture
def faulty(workdir: Path) -> Iterator[FaultyGateway]:
    config = workdir / "gateway.yaml"
    config.write_text(CONFIG)
    gateway = FaultyGateway(workdir, "256MiB", "--config", str(config))
    yield gateway.start()  # type: ignore[misc]
    gateway.kill()


@pytest.fixture
def shallow(workdir: Path) -> Iterator[FaultyGateway]:
    """A gateway whose stores may write one fragment's bytes at once (the write depth)."""
    config = workdir / "gateway.yaml"
    config.write_text(CONFIG + "store_inflight_max: 1MiB\n")
    gateway = FaultyGateway(workdir, "256MiB", "--config", str(config))
    yield gateway.start()  # type: ignore[misc]
    gateway.kill()


def check_disk(gateway: Gateway) -> str:
    result = subprocess.run(
        [
            str(BIN / "adp-gateway"),
            "check",
            "--config",
            str(gateway.log_path.parent / "gateway.yaml"),
            "--data-dir",
            str(gateway.data_dir),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return f"exit {result.returncode}: {result.stdout}"


def test_disk_errors_and_a_full_disk_fail_only_the_ops_they_touch(faulty: FaultyGateway) -> None:
    client = Client(faulty)
    stored = {
        **keyed_objects(1, 6, 2 * FRAGMENT_BYTES + 12345),
        **keyed_objects(2, 12, 256 * 2**10),
    }
    assert client.store(stored) == [True] * len(stored)

    faulty.inject(database=0, fail="read", errno=errno.EIO, count=3)
    hits = client.load(stored)
    # Each failed read costs at most its own object: a read of several values together that
    # fails is retried one value at a time (ValueIO.read_isolated in the software card).
    assert hits.count(False) <= 3
    assert "read from database 0 failed: [Errno 5]" in faulty.log()
    assert client.exists(list(stored)) == [True] * len(stored)  # a read error is not damage
    assert client.load(stored) == [True] * len(stored)

    faulty.inject(database=1, fail="write", errno=errno.EIO, count=2)
    written = keyed_objects(3, 8, 256 * 2**10)
    written_ok = client.store(written)
    assert 0 < written_ok.count(False) <= 2
    assert client.load(stored) == [True] * len(stored)

    faulty.inject(database=0, fail="write", errno=errno.ENOSPC, count=10_000)
    full = keyed_objects(4, 8, 256 * 2**10)
    results = client.store(full)
    for key, ok in zip(full, results, strict=True):
        assert ok == (0 not in databases_of(key, 256 * 2**10)), key  # db 1 still takes stores
    assert client.load(stored) == [True] * len(stored)  # loads go on while db 0 is full
    assert "write to database 0 failed: [Errno 28]" in faulty.log()

    faulty.inject(clear=True)
    assert client.store(full) == [True] * len(full)
    acknowledged = {
        **stored,
        **{k: v for (k, v), ok in zip(written.items(), written_ok, strict=True) if ok},
        **full,
    }
    client.close()
    assert faulty.alive
    faulty.stop()
    assert check_disk(faulty).startswith("exit 0"), check_disk(faulty)
    faulty.start()
    client = Client(faulty)
    assert client.load(acknowledged) == [True] * len(acknowledged)
    client.close()


def test_stalls_expire_their_own_ops_while_the_rest_is_served(faulty: FaultyGateway) -> None:
    client = Client(faulty)
    size = 256 * 2**10
    stored = keyed_objects(5, 32, size)
    assert client.store(stored) == [True] * len(stored)
    on_db1 = {k: v for k, v in stored.items() if databases_of(k, size) == {1}}
    on_db0 = {k: v for k, v in stored.items() if databases_of(k, size) == {0}}
    assert len(on_db0) > 8 and on_db1  # more than the gateway's 8 I/O threads

    faulty.inject(database=1, delay_s=0.3)  # a latency spike: slower, not failing
    assert client.load(on_db1) == [True] * len(on_db1)
    faulty.inject(database=1, delay_s=0)

    # A stall past every deadline, catching more ops than there are I/O threads: each holds its
    # thread until the disk answers, but ops on one database may hold only 6 of the 8.
    faulty.inject(database=0, delay_s=OP_TIMEOUT_S + 3)
    assert client.load(on_db0) == [False] * len(on_db0)  # within the deadline, as misses
    started = time.monotonic()
    assert client.exists(list(stored)) == [True] * len(stored)
    assert client.load(on_db1) == [True] * len(on_db1)  # the other database is served
    assert time.monotonic() - started < OP_TIMEOUT_S

    faulty.inject(clear=True)
    wait_until(lambda: client.load(stored) == [True] * len(stored), 30, "the stall to drain")
    client.close()


def test_a_store_stuck_past_its_deadline_holds_up_no_store_to_another_database(
    shallow: FaultyGateway,
) -> None:
    """A store stuck in a stalled database's kernel counted against the write depth until the
    disk answered: with the depth full, every store to the other database waited behind it and
    expired. Once past its deadline it counts no more."""
    client = Client(shallow)
    stored = keyed_objects(7, 16, FRAGMENT_BYTES)
    on_db0 = {k: v for k, v in stored.items() if databases_of(k, FRAGMENT_BYTES) == {0}}
    on_db1 = {k: v for k, v in stored.items() if databases_of(k, FRAGMENT_BYTES) == {1}}
    assert on_db0 and on_db1
    shallow.inject(database=0, delay_s=OP_TIMEOUT_S + 4)
    assert client.store(on_db0) == [False] * len(on_db0)
    assert client.store(on_db1) == [True] * len(on_db1)
    shallow.inject(clear=True)
    assert client.load(on_db1) == [True] * len(on_db1)
    client.close()


def test_a_corrupted_byte_is_a_logged_miss_and_check_names_it(faulty: FaultyGateway) -> None:
    client = Client(faulty)
    stored = keyed_objects(6, 4, 256 * 2**10)
    assert client.store(stored) == [True] * 4
    client.close()
    faulty.stop()
    victim, data = next(iter(stored.items()))
    database = faulty.data_dir / f"db{min(databases_of(victim, len(data)))}.adp"
    image = database.read_bytes()
    at = image.index(data[:4096]) + 1000  # inside the victim's payload
    with open(database, "r+b") as f:
        f.seek(at)
        f.write(bytes([image[at] ^ 0x01]))
    faulty.start()
    client = Client(faulty)
    assert client.load(stored) == [False, True, True, True]
    assert "failed its checksum; reporting a miss" in faulty.log()
    client.close()
    faulty.stop()
    report = check_disk(faulty)
    assert report.startswith("exit 1"), report
    assert re.search(rf"{re.escape(victim)} fragment 0 \(version \d+\): payload fails", report), (
        report
    )


def test_a_stop_with_a_write_stuck_in_the_kernel_ends_on_time_and_leaves_the_data_readable(
    faulty: FaultyGateway,
) -> None:
    """A stop used to join each I/O thread for 30 s and then seal and sync under a thread still
    in the kernel (each footer write stuck too): a stalled disk held SIGTERM for minutes, past
    systemd's TimeoutStopSec. Now it waits STOP_IO_WAIT_S in all, leaves the databases as a
    kill would (never closed under a running write), and exits; the next start recovers
    everything acknowledged before."""
    client = Client(faulty)
    kept = keyed_objects(40, 3, FRAGMENT_BYTES)
    assert client.store(kept) == [True] * 3
    for database in (0, 1):
        faulty.inject(database=database, delay_s=120)
    mark = len(faulty.log())
    client.connector.submit_batch_set(["stuck"], [memoryview(bytearray(FRAGMENT_BYTES))])
    wait_until(lambda: "holding a write" in faulty.log()[mark:], 10, "the stuck write")
    client.close()
    started = time.monotonic()
    assert faulty.stop(timeout_s=60) == 0
    assert time.monotonic() - started < STOP_IO_WAIT_S + CLOSE_WAIT_S + 5
    assert "still waiting on the disk" in faulty.log()
    faulty.start()
    client = Client(faulty)
    try:
        assert client.load(kept) == [True] * 3
    finally:
        client.close()
