"""Goal: the gateway process refuses bad configs and environments with one clear line, stops
cleanly on SIGTERM, drops a client that writes garbage into its ring while serving others, and
frees every fd and mapping of a client killed mid-transfer."""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from adp_gateway.config import GatewayConfig
from adp_gateway.host.priority import STORE_PATIENCE_S
from adp_wire.protocol import Hello, Op, hello_body, parse_welcome, recv_frame, send_frame
from adp_wire.ring.layout import SQ_TAIL, SUBMISSION, RingLayout, map_shared
from lmcache_adp import ADPConnector
from tests.support import BIN, Gateway, session_resources, wait_for_future, wait_until
from tests.support.faulty_gateway import FaultyGateway
from tests.support.plugin import connected, make_tenant_table, objects, views


def run_gateway(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "adp-gateway"), "serve", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("adp-gateway:")]
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_socket_served_by_a_live_gateway_is_refused(gateway: Gateway, workdir: Path) -> None:
    result = run_gateway(
        "--data-dir",
        str(workdir / "other"),
        "--socket",
        str(gateway.socket_path),
        "--capacity",
        "256MiB",
    )
    assert "already served by a live gateway" in one_line_error(result)
    assert gateway.alive


def test_unwritable_data_dir_is_refused(workdir: Path) -> None:
    (workdir / "file").write_text("")
    result = run_gateway(
        "--data-dir", str(workdir / "file" / "data"), "--socket", str(workdir / "s.sock")
    )
    assert "cannot create data dir" in one_line_error(result)


def test_capacity_above_free_space_is_refused(workdir: Path) -> None:
    result = run_gateway(
        "--data-dir",
        str(workdir / "d"),
        "--socket",
        str(workdir / "s.sock"),
        "--capacity",
        "5000TiB",
    )
    assert "lower `capacity` or free space" in one_line_error(result)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("capacty: 1GiB\n", "unknown key 'capacty'; did you mean 'capacity'"),
        ("capacity: lots\n", "capacity: cannot read 'lots' as a size"),
        ("cpu_nice: 25\n", "cpu_nice: must be at most 19, got 25"),
    ],
)
def test_bad_config_file_is_refused(workdir: Path, text: str, match: str) -> None:
    (workdir / "g.yaml").write_text(text)
    result = run_gateway("--config", str(workdir / "g.yaml"), "--data-dir", str(workdir / "d"))
    assert match in one_line_error(result)


def thread_nice_values(pid: int) -> set[int]:
    """The nice value of each of the process's threads (field 19 of /proc/PID/task/TID/stat)."""
    values = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that just ended
            values.add(int((task / "stat").read_text().rsplit(")", 1)[1].split()[16]))
    return values


def autogroup_nice(pid: int) -> int | None:
    """The nice value of the process's autogroup ("/autogroup-42 nice 10"), None without one."""
    path = Path(f"/proc/{pid}/autogroup")
    return int(path.read_text().split()[-1]) if path.exists() else None


def test_the_gateway_runs_below_the_model_servers_cpu_priority(gateway: Gateway) -> None:
    """Every thread at cpu_nice (19), and so is the autogroup of the session it leads (the
    tests start it with setsid, as scripts/serve.sh does): LMCache's threads run first."""
    nice = GatewayConfig().cpu_nice
    assert nice > os.getpriority(os.PRIO_PROCESS, 0)
    assert gateway.proc is not None
    pid = gateway.proc.pid
    assert os.getsid(pid) == pid
    assert len(list(Path(f"/proc/{pid}/task").iterdir())) > 8  # its I/O threads are running
    assert thread_nice_values(pid) == {nice}
    if autogroup_nice(pid) is not None:
        assert autogroup_nice(pid) == nice
    assert f"its threads nice {nice}" in gateway.log()


def test_cpu_nice_0_keeps_the_priority_the_gateway_started_with(
    make_gateway: Callable[..., Gateway], workdir: Path
) -> None:
    (workdir / "g.yaml").write_text("cpu_nice: 0\n")
    gateway = make_gateway("256MiB", "--config", str(workdir / "g.yaml")).start()
    assert gateway.proc is not None
    assert thread_nice_values(gateway.proc.pid) == {os.getpriority(os.PRIO_PROCESS, 0)}
    assert autogroup_nice(gateway.proc.pid) in (None, 0)


def test_while_loads_run_or_stores_wait_the_autogroup_is_back_at_its_starting_priority(
    workdir: Path,
) -> None:
    """LMCache waits for loads: while one runs (its reads held up here), the gateway's
    autogroup has the nice value it started with, and once the load is done it goes back to
    cpu_nice. A store does not raise it until it has waited longer than STORE_PATIENCE_S (a
    starved gateway would let it reach its deadline), then does, until it is done."""
    (workdir / "g.yaml").write_text("databases_per_dir: 2\n")
    gateway = FaultyGateway(workdir, "1GiB", "--config", str(workdir / "g.yaml"))
    connector = None
    try:
        gateway.start()
        assert gateway.proc is not None
        pid, lowered = gateway.proc.pid, GatewayConfig().cpu_nice
        if autogroup_nice(pid) is None:
            pytest.skip("this kernel has no autogroups")
        said = re.search(rf"nice {lowered} \((\d+) while loads run or stores wait\)", gateway.log())
        assert said is not None, gateway.log()
        started = int(said[1])  # a new session's autogroup starts at 0
        assert started < lowered
        connector = ADPConnector(**gateway.adapter_params(op_timeout_s=30))
        connected(connector)
        data = objects(2, 2 * 2**20)
        stored = connector.submit_batch_set(["k0"], views(data[:1]))
        assert wait_for_future(connector, stored)[1]
        for database in range(2):
            gateway.inject(database=database, delay_s=STORE_PATIENCE_S + 2)

        mark = len(gateway.log())
        stored = connector.submit_batch_set(["k1"], views(data[1:]))
        wait_until(lambda: "holding a write" in gateway.log()[mark:], 10, "the store's write")
        assert autogroup_nice(pid) == lowered
        wait_until(lambda: autogroup_nice(pid) == started, 2 + STORE_PATIENCE_S, "the raise")
        assert wait_for_future(connector, stored)[1]
        wait_until(lambda: autogroup_nice(pid) == lowered, 10, "the autogroup lowered again")
        for database in range(2):
            gateway.inject(database=database, delay_s=1.5)

        mark = len(gateway.log())
        into = bytearray(len(data[0]))
        loaded = connector.submit_batch_get(["k0"], [memoryview(into)])
        wait_until(lambda: "holding a read" in gateway.log()[mark:], 10, "the load's read")
        wait_until(lambda: autogroup_nice(pid) == started, 1, "the autogroup's priority raised")
        assert wait_for_future(connector, loaded)[1]
        assert into == data[0]
        wait_until(lambda: autogroup_nice(pid) == lowered, 10, "the autogroup lowered again")
    finally:
        if connector is not None:
            connector.close()
        gateway.kill()


def test_sigterm_stops_cleanly_and_removes_the_socket(gateway: Gateway) -> None:
    assert gateway.stop(signal.SIGTERM) == 0
    assert "gateway stopped" in gateway.log()
    assert not gateway.socket_path.exists()


def test_restart_after_sigkill_takes_over_the_stale_socket(gateway: Gateway) -> None:
    gateway.kill()
    assert gateway.socket_path.exists()
    gateway.start()
    assert gateway.alive


@pytest.mark.parametrize("kind", ["regular file", "directory", "symbolic link"])
def test_a_socket_path_that_is_not_a_socket_is_refused_and_left_alone(
    workdir: Path, kind: str
) -> None:
    """A swapped `--config` and `--socket` must not delete the operator's file: only a socket
    is ever removed at that path; anything else is one line, and stays as it was."""
    target = workdir / "gateway.yaml"
    target.write_text("capacity: 256MiB\n")
    path = workdir / "not-a-socket"
    if kind == "regular file":
        path = target
    elif kind == "directory":
        path.mkdir()
        (path / "inside").write_text("kept")
    else:
        path.symlink_to(target)
    result = run_gateway(
        "--data-dir", str(workdir / "d"), "--socket", str(path), "--capacity", "256MiB"
    )
    assert f"is a {kind}, not a socket" in one_line_error(result)
    assert "Traceback" not in result.stderr
    assert target.read_text() == "capacity: 256MiB\n"
    assert path.exists() or path.is_symlink()
    if kind == "directory":
        assert (path / "inside").read_text() == "kept"
    assert not (workdir / "d").exists()  # refused before any database was made


def test_stop_leaves_a_socket_path_another_process_took_over(gateway: Gateway) -> None:
    """At stop the gateway removes its own socket, not a file put at its path since."""
    gateway.socket_path.unlink()
    gateway.socket_path.write_text("someone else's")
    assert gateway.stop(signal.SIGTERM) == 0
    assert gateway.socket_path.read_text() == "someone else's"


@contextlib.contextmanager
def hostile_client(
    socket_path: Path,
) -> Iterator[tuple[socket.socket, memoryview, int, RingLayout]]:
    """A client that handshakes, then writes what it likes into its shared memory; its socket,
    fds and mapping are closed when the block ends."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(socket_path))
    send_frame(sock, hello_body(Hello(tenant="evil")))
    body, fds = recv_frame(sock, fds_max=3)
    welcome = parse_welcome(body)
    layout = RingLayout(welcome.slots, welcome.arena_bytes, welcome.window_bytes)
    mapping = map_shared(fds[0], layout)
    memory = memoryview(mapping)
    try:
        yield sock, memory, fds[1], layout
    finally:
        memory.release()
        mapping.close()
        sock.close()
        for fd in fds:
            os.close(fd)


@pytest.mark.parametrize("garbage", ["random", "slot", "window", "tail", "keys"])
def test_garbage_in_a_ring_drops_only_that_session(gateway: Gateway, garbage: str) -> None:
    good = ADPConnector(**gateway.adapter_params())
    try:
        connected(good)
        with hostile_client(gateway.socket_path) as (sock, memory, doorbell, layout):
            make_garbage(garbage, memory, doorbell, layout)
            sock.settimeout(10)
            assert sock.recv(1) == b""  # the gateway hung up on us
        wait_until(lambda: "dropping the session" in gateway.log(), 10, "the drop to be logged")
        data = objects(2, 65536)
        item = wait_for_future(good, good.submit_batch_set(["a", "b"], views(data)))
        assert item[1] is True
        assert gateway.alive
    finally:
        good.close()


def make_garbage(garbage: str, memory: memoryview, doorbell: int, layout: RingLayout) -> None:
    """Write one kind of garbage into a client's submission ring, and ring."""
    rng = random.Random(garbage)
    entry = [1, Op.GET, 0, 0, 0, 0, 0, 2**63, 0, 4096]  # slot 0, no keys
    if garbage == "random":
        memory[layout.sq_offset : layout.sq_offset + 64] = rng.randbytes(64)
    elif garbage == "slot":
        entry[4] = layout.slots + 5
    elif garbage == "window":
        entry[8], entry[9] = layout.window_bytes - 4096, 8192
    elif garbage == "keys":
        arena = layout.arenas_offset
        memory[arena : arena + 16] = rng.randbytes(16)
        entry[5] = 16
    if garbage not in ("random",):
        SUBMISSION.pack_into(memory, layout.sq_offset, *entry)
    tail = 2**40 if garbage == "tail" else 1
    struct.pack_into("<Q", memory, SQ_TAIL, tail)
    os.eventfd_write(doorbell, 1)


def test_refused_handshake_reaches_the_client_as_a_clear_error(gateway: Gateway) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(gateway.socket_path))
    send_frame(sock, {"protocol": 99, "tenant": "t"})
    body, _ = recv_frame(sock)
    assert body["ok"] is False and "protocol 99" in body["error"]
    sock.close()


def test_module_entry_point_prints_help() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "adp_gateway", "--help"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0 and "serve" in result.stdout


def test_cli_usage_error_is_not_a_traceback(make_gateway: Callable[..., Gateway]) -> None:
    result = run_gateway("--capacity")
    assert result.returncode == 2 and "Traceback" not in result.stderr


def test_a_session_logs_what_it_did_when_it_ends(gateway: Gateway) -> None:
    connector = ADPConnector(**gateway.adapter_params())
    try:
        connected(connector)
        data = objects(2, 8192)
        wait_for_future(connector, connector.submit_batch_set(["a", "b"], views(data)))
        out = [bytearray(8192) for _ in range(3)]
        wait_for_future(connector, connector.submit_batch_get(["a", "b", "c"], views(out)))
    finally:
        connector.close()
    wait_until(
        lambda: "closed: 3 loads (2 hits, 16.0 KiB), 2 stores" in gateway.log(),
        10,
        "the session's summary in the log",
    )


@pytest.mark.parametrize("policy", ["periodic", "none"])
def test_every_sync_policy_serves_and_survives_a_kill(
    make_gateway: Callable[..., Gateway], workdir: Path, policy: str
) -> None:
    (workdir / "sync.yaml").write_text(f"sync: {policy}\nsync_interval_ms: 20\n")
    gateway = make_gateway("1GiB", "--config", str(workdir / "sync.yaml")).start()
    data = objects(3, 300_000)
    connector = ADPConnector(**gateway.adapter_params())
    try:
        connected(connector)
        item = wait_for_future(connector, connector.submit_batch_set(["a", "b", "c"], views(data)))
        assert item[3] == [True, True, True]
    finally:
        connector.close()
    gateway.kill()  # a crash of the process loses nothing acknowledged, whatever the policy
    gateway.start()
    connector = ADPConnector(**gateway.adapter_params())
    try:
        connected(connector)
        out = [bytearray(300_000) for _ in range(3)]
        item = wait_for_future(connector, connector.submit_batch_get(["a", "b", "c"], views(out)))
        assert item[3] == [True, True, True] and out == data
    finally:
        connector.close()


STORER = """
import sys, numpy as np
from lmcache_adp import ADPConnector
from tests.support import wait_for_future
c = ADPConnector(socket_path=sys.argv[1], op_timeout_s=30.0)
data = [memoryview(bytearray(np.random.default_rng(i).bytes(8 * 2**20))) for i in range(8)]
n = 0
while True:  # stores until killed, eight 8 MiB objects in flight at a time
    keys = [f"dying{n}-{i}" for i in range(8)]
    print("stored", wait_for_future(c, c.submit_batch_set(keys, data))[1], flush=True)
    n += 1
"""


def test_a_client_killed_mid_transfer_frees_its_session(gateway: Gateway) -> None:
    make_tenant_table(gateway)
    baseline = session_resources(gateway)
    assert baseline[1] == 0
    client = subprocess.Popen(
        [sys.executable, "-c", STORER, str(gateway.socket_path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    try:
        assert client.stdout is not None
        assert client.stdout.readline().startswith("stored")  # a batch went through
        assert session_resources(gateway)[1] >= 1
        client.kill()  # with the next batch in flight
    finally:
        client.kill()
        client.wait(10)
        if client.stdout is not None:
            client.stdout.close()
    wait_until(lambda: "client disconnected" in gateway.log(), 10, "the gateway to notice")
    wait_until(
        lambda: session_resources(gateway) == baseline,
        30,
        f"the session's fds and shared memory to be freed (baseline {baseline})",
    )
    connector = ADPConnector(**gateway.adapter_params())  # the gateway serves the next client
    try:
        connected(connector)
        data = objects(1, 2**20)
        assert wait_for_future(connector, connector.submit_batch_set(["next"], views(data)))[1]
    finally:
        connector.close()


def test_a_socket_directory_that_exists_is_never_regrouped_for_socket_group(
    workdir: Path,
) -> None:
    """It may be someone's: one the group cannot reach is refused, untouched."""
    directory = workdir / "sockets"
    directory.mkdir(mode=0o700)
    config = workdir / "gateway.yaml"
    config.write_text("socket_group: nogroup\n")
    result = run_gateway(
        "--data-dir", str(workdir / "d"), "--socket", str(directory / "gw.sock"),
        "--capacity", "256MiB", "--config", str(config),
    )  # fmt: skip
    assert "exists, but group 'nogroup' cannot reach the socket" in one_line_error(result)
    info = directory.stat()
    assert (info.st_mode & 0o777, info.st_gid) == (0o700, os.getegid())
