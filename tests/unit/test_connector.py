"""Goal: the plugin keeps LMCache's native_plugin contract against a real gateway process:
exact completion tuples, one bool per key, byte-exact data, and every op completed within
op_timeout_s whether the gateway is up, absent, killed or hung."""

from __future__ import annotations

import errno
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from adp_gateway.errors import ConfigError
from lmcache_adp import ADPConnector, l1_segment
from tests.support import Gateway, wait_for_future, wait_until
from tests.support.plugin import connected, objects, views


@pytest.fixture
def connect() -> Iterator[Callable[..., ADPConnector]]:
    made: list[ADPConnector] = []

    def make(gateway: Gateway, **params: object) -> ADPConnector:
        connector = ADPConnector(**gateway.adapter_params(**params))
        made.append(connector)
        return connector

    yield make
    for connector in made:
        connector.close()


def check_shape(item: tuple[object, ...], future_id: int, keys: int) -> None:
    assert len(item) == 4 and item[0] == future_id
    assert type(item[1]) is bool and type(item[2]) is str
    assert isinstance(item[3], list) and len(item[3]) == keys
    assert all(type(b) is bool for b in item[3])


@pytest.mark.parametrize("size", [256 * 2**10, 100_003, 4 * 2**20 + 5])
def test_store_exists_load_delete_round_trip(
    gateway: Gateway, connect: Callable[..., ADPConnector], size: int
) -> None:
    connector = connect(gateway)
    connected(connector)
    keys = [f"m@00000000@0@{i:064x}" for i in range(6)]
    data = objects(len(keys), size)
    fid = connector.submit_batch_set(keys, views(data))
    item = wait_for_future(connector, fid)
    check_shape(item, fid, len(keys))
    assert item[1] is True

    fid = connector.submit_batch_exists([*keys, "absent"])
    item = wait_for_future(connector, fid)
    check_shape(item, fid, len(keys) + 1)
    assert item[3] == [True] * len(keys) + [False]

    out = [bytearray(size) for _ in keys] + [bytearray(size)]
    fid = connector.submit_batch_get([*keys, "absent"], views(out))
    item = wait_for_future(connector, fid)
    check_shape(item, fid, len(keys) + 1)
    assert item[3] == [True] * len(keys) + [False]
    assert out[: len(keys)] == data

    fid = connector.submit_batch_delete([keys[0], "absent"])
    item = wait_for_future(connector, fid)
    check_shape(item, fid, 2)
    assert item[3] == [True, False]
    assert wait_for_future(connector, connector.submit_batch_exists(keys[:2]))[3] == [False, True]


def test_a_batch_of_many_keys_spans_several_ring_requests(
    gateway: Gateway, connect: Callable[..., ADPConnector]
) -> None:
    connector = connect(gateway)
    connected(connector)
    keys = [f"model/name@00000000@0@{i:064x}" for i in range(3000)]
    item = wait_for_future(connector, connector.submit_batch_exists(keys))
    assert item[3] == [False] * 3000
    data = objects(1, 4096)[0]
    wait_for_future(connector, connector.submit_batch_set([keys[2500]], [memoryview(data)]))
    item = wait_for_future(connector, connector.submit_batch_exists(keys))
    assert [i for i, hit in enumerate(item[3]) if hit] == [2500]


def test_load_of_wrong_size_is_a_miss_not_wrong_bytes(
    gateway: Gateway, connect: Callable[..., ADPConnector]
) -> None:
    connector = connect(gateway)
    connected(connector)
    wait_for_future(connector, connector.submit_batch_set(["k"], views(objects(1, 8192))))
    out = bytearray(b"\x07" * 4096)
    item = wait_for_future(connector, connector.submit_batch_get(["k"], [memoryview(out)]))
    assert item[3] == [False] and out == bytearray(b"\x07" * 4096)


def test_unknown_or_mistyped_params_raise_naming_the_field() -> None:
    with pytest.raises(ConfigError, match="unknown key 'socket'"):
        ADPConnector(socket="/x")
    with pytest.raises(ConfigError, match="op_timeout_s"):
        ADPConnector(op_timeout_s="fast")


def test_without_a_gateway_ops_miss_at_once_then_work_when_it_starts(
    make_gateway: Callable[..., Gateway], connect: Callable[..., ADPConnector]
) -> None:
    gateway = make_gateway()
    connector = connect(gateway, reconnect_interval_s=0.1)
    started = time.monotonic()
    item = wait_for_future(connector, connector.submit_batch_exists(["a", "b"]))
    assert item[3] == [False, False]
    item = wait_for_future(connector, connector.submit_batch_set(["a"], views(objects(1, 4096))))
    assert item[1] is False
    assert time.monotonic() - started < 2  # misses come at once, not at the timeout
    gateway.start()
    connected(connector)
    item = wait_for_future(connector, connector.submit_batch_set(["a"], views(objects(1, 4096))))
    assert item[1] is True


def test_an_unexpected_error_connecting_does_not_end_the_retries(
    gateway: Gateway, connect: Callable[..., ADPConnector], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading /proc/self/maps can fail (EMFILE in a busy LMCache process): that attempt fails,
    and the next one connects."""
    failures = [OSError(errno.EMFILE, "Too many open files")]
    find = l1_segment.find

    def find_once_failing(*args: str) -> l1_segment.L1Map | None:
        if failures:
            raise failures.pop()
        return find(*args)

    monkeypatch.setattr(l1_segment, "find", find_once_failing)
    connector = connect(gateway, reconnect_interval_s=0.1)
    connected(connector)
    assert failures == []
    item = wait_for_future(connector, connector.submit_batch_set(["a"], views(objects(1, 4096))))
    assert item[1] is True


def test_gateway_killed_mid_traffic_completes_every_op_then_recovers(
    gateway: Gateway, connect: Callable[..., ADPConnector]
) -> None:
    timeout_s = 2.0
    connector = connect(gateway, op_timeout_s=timeout_s, reconnect_interval_s=0.1)
    connected(connector)
    data = objects(8, 4 * 2**20)
    futures = [
        connector.submit_batch_set([f"k{i}-{j}" for j in range(8)], views(data)) for i in range(6)
    ]
    gateway.send_signal(signal.SIGKILL)
    submitted = time.monotonic()
    futures.append(connector.submit_batch_exists(["k0-0"]))
    for fid in futures:
        item = wait_for_future(connector, fid, timeout_s=timeout_s + 5)
        check_shape(item, fid, len(item[3]))
    assert time.monotonic() - submitted < timeout_s + 1.0
    gateway.proc.wait(10)  # type: ignore[union-attr]
    gateway.start()
    connected(connector)
    item = wait_for_future(connector, connector.submit_batch_set(["after"], views(data[:1])))
    assert item[1] is True


def test_hung_gateway_ops_time_out_and_resume_after(
    gateway: Gateway, connect: Callable[..., ADPConnector]
) -> None:
    timeout_s = 1.0
    connector = connect(gateway, op_timeout_s=timeout_s)
    connected(connector)
    data = objects(2, 2**20)
    gateway.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        out = [bytearray(2**20) for _ in data]
        fids = [
            connector.submit_batch_set(["x", "y"], views(data)),
            connector.submit_batch_get(["x", "y"], views(out)),
            connector.submit_batch_exists(["x"]),
            connector.submit_batch_delete(["x"]),
        ]
        for fid in fids:
            item = wait_for_future(connector, fid, timeout_s=timeout_s + 5)
            assert item[1] is False or item[3] == [False] * len(item[3])
        assert time.monotonic() - started < timeout_s + 1.0
    finally:
        gateway.send_signal(signal.SIGCONT)
    # The gateway wakes up with the stale ops: it expires them, and new ops work again.
    item = wait_for_future(connector, connector.submit_batch_set(["z"], views(data[:1])))
    assert item[1] is True
    out = [bytearray(2**20)]
    assert wait_for_future(connector, connector.submit_batch_get(["z"], views(out)))[3] == [True]
    assert out[0] == data[0]


def test_stores_the_gateway_cannot_take_yet_wait_for_room_and_are_all_stored(
    workdir: Path, make_gateway: Callable[..., Gateway], connect: Callable[..., ADPConnector]
) -> None:
    """A burst of stores far over what the session's window holds waits in the plugin (LMCache
    holds the bytes in L1 anyway) instead of failing: once the gateway takes them, every one
    is stored."""
    (workdir / "gateway.yaml").write_text("session_window_size: 1MiB\n")
    gateway = make_gateway("256MiB", "--config", str(workdir / "gateway.yaml")).start()
    connector = connect(gateway, op_timeout_s=60.0)
    connected(connector)
    data = objects(8, 2**20)
    gateway.send_signal(signal.SIGSTOP)  # nothing drains: one store fills the window
    try:
        fids = [connector.submit_batch_set([f"k{i}"], views([d])) for i, d in enumerate(data)]
        time.sleep(1.0)  # long enough for a store shed at once to have been reported
        assert connector.drain_completions() == []
    finally:
        gateway.send_signal(signal.SIGCONT)
    stored = [wait_for_future(connector, fid, timeout_s=30) for fid in fids]
    assert [item[1] for item in stored] == [True] * 8


def test_stores_that_wait_past_their_deadline_fail_then_and_are_counted_as_untaken(
    workdir: Path, make_gateway: Callable[..., Gateway], connect: Callable[..., ADPConnector]
) -> None:
    """A store that finds no room before its deadline fails at the deadline, not sooner, and
    the gateway counts it, from the plugin's tally, in its metric and the session's line."""
    (workdir / "gateway.yaml").write_text("session_window_size: 1MiB\n")
    gateway = make_gateway("256MiB", "--config", str(workdir / "gateway.yaml")).start()
    connector = connect(gateway, op_timeout_s=1.5)
    connected(connector)
    data = objects(4, 2**20)
    gateway.send_signal(signal.SIGSTOP)
    try:
        submitted = time.monotonic()
        fids = [connector.submit_batch_set([f"k{i}"], views([d])) for i, d in enumerate(data)]
        failed = [wait_for_future(connector, fid, timeout_s=10) for fid in fids]
        assert time.monotonic() - submitted >= 1.5
        assert [item[1] for item in failed] == [False] * 4
    finally:
        gateway.send_signal(signal.SIGCONT)
    connector.close()
    wait_until(lambda: "stores not taken" in gateway.log(), 10, "the session's summary line")
    line = next(x for x in gateway.log().splitlines() if "stores not taken" in x)
    assert "; 4 stores not taken (4.0 MiB)" in line


def test_delete_never_raises(gateway: Gateway, connect: Callable[..., ADPConnector]) -> None:
    connector = connect(gateway)
    fid = connector.submit_batch_delete(None)  # type: ignore[arg-type]
    item = wait_for_future(connector, fid)
    assert item[1] is False


def test_close_reports_every_op_once_and_stops_every_thread(gateway: Gateway) -> None:
    connector = ADPConnector(**gateway.adapter_params())
    connected(connector)
    data = objects(4, 2**20)
    futures = [connector.submit_batch_set([f"q{i}"], views([d])) for i, d in enumerate(data)]
    futures.append(connector.submit_batch_exists(["q0", "q9"]))
    connector.close()
    reported = connector.drain_completions()
    assert sorted(item[0] for item in reported) == sorted(futures)
    for item in reported:
        check_shape(item, int(item[0]), 2 if item[0] == futures[-1] else 1)
    assert not [t for t in threading.enumerate() if t.name.startswith("adp-")]
    # A submit after close completes at once, as a failure.
    future_id = connector.submit_batch_exists(["q0"])
    [(reported_id, ok, _, per_key)] = connector.drain_completions()
    assert (reported_id, ok, per_key) == (future_id, False, [False])


def test_start_up_is_never_held_up_by_a_missing_or_stopped_gateway(
    make_gateway: Callable[..., Gateway],
) -> None:
    absent = make_gateway()
    started = time.monotonic()
    ADPConnector(**absent.adapter_params()).close()
    assert time.monotonic() - started < 1.0

    stopped = make_gateway(socket_path=absent.socket_path.with_name("stopped.sock")).start()
    stopped.send_signal(signal.SIGSTOP)  # it accepts connections but never answers
    try:
        started = time.monotonic()
        connector = ADPConnector(**stopped.adapter_params())
        assert time.monotonic() - started < 1.0
        item = wait_for_future(connector, connector.submit_batch_exists(["k"]), timeout_s=10)
        assert item[3] == [False]
    finally:
        stopped.send_signal(signal.SIGCONT)
    connected(connector)  # and it connects once the gateway answers
    connector.close()


def test_a_gateway_on_the_memory_card_serves_clients_through_the_same_seam(
    make_gateway: Callable[..., Gateway], connect: Callable[..., ADPConnector], workdir: Path
) -> None:
    """`card: memory` in the config: the gateway above the seam is unchanged, and it stores,
    finds, loads and deletes on the memory card; a restart starts it empty (it is volatile)."""
    (workdir / "gateway.yaml").write_text("card: memory\n")
    gateway = make_gateway("256MiB", "--config", str(workdir / "gateway.yaml")).start()
    assert "recovered 0 objects" in gateway.log()
    connector = connect(gateway, reconnect_interval_s=0.1)
    connected(connector)
    keys = [f"m@00000000@0@{i:064x}" for i in range(4)]
    data = objects(len(keys), 4 * 2**20 + 5)  # two fragments each
    assert wait_for_future(connector, connector.submit_batch_set(keys, views(data)))[1] is True
    out = [bytearray(len(data[0])) for _ in keys]
    assert wait_for_future(connector, connector.submit_batch_get(keys, views(out)))[3] == [
        True
    ] * len(keys)
    assert out == data
    assert wait_for_future(connector, connector.submit_batch_delete(keys[:1]))[3] == [True]
    assert wait_for_future(connector, connector.submit_batch_exists(keys))[3] == [
        False,
        True,
        True,
        True,
    ]
    gateway.restart()
    connected(connector)
    assert wait_for_future(connector, connector.submit_batch_exists(keys))[3] == [False] * 4
