"""Goal: no local process can exhaust the gateway by connecting. A flood of 1,000 connections
(closed at once, silent, stopping half-way through a hello, or finishing the handshake and then
never reading) leaves the gateway's threads, file descriptors and memory within fixed bounds set
by ``max_sessions`` and the handshakes it runs at once; connections past the bounds are refused
with a line saying why, and leave nothing behind, not even the fd of an L1 segment they sent; a
client that was connected before keeps being served throughout, and a new one is served once
the flood has gone, or once the gateway, out of fds for a while, has some again.
"""

from __future__ import annotations

import os
import resource
import select
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from adp_gateway.front.handshake_slots import PER_UID_MAX
from adp_wire.protocol import Hello, hello_body, send_frame
from lmcache_adp import ADPConnector
from lmcache_adp.link import GatewayLink
from tests.support import BIN, Gateway, wait_for_future, wait_until
from tests.support.plugin import connected

pytestmark = pytest.mark.integration
MAX_SESSIONS = 8
CONFIG = f"max_sessions: {MAX_SESSIONS}\nhandshake_timeout_s: 1.0\nsession_window_size: 8MiB\n"
NOBODY = 65534  # uid of `nobody` and gid of `nogroup` on Debian


def group_socket(workdir: Path) -> Path:
    """A socket in a directory the gateway makes, so that it gives it to ``socket_group``."""
    return workdir / "sockets" / "gw.sock"


KINDS = ("closed at once", "silent", "half a hello", "never reads")
WAVES, PER_WAVE = 4, 250  # 1,000 connections


def usage(pid: int) -> tuple[int, int, int]:
    """The gateway's threads, open fds and resident bytes."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = dict(line.split(":", 1) for line in status)
    threads = int(fields["Threads"])
    rss_bytes = int(fields["VmRSS"].split()[0]) * 1024
    return threads, len(list(Path(f"/proc/{pid}/fd").iterdir())), rss_bytes


@contextmanager
def sampled(pid: int) -> Iterator[list[tuple[int, int, int]]]:
    """Samples of ``usage`` every 20 ms while the block runs."""
    samples: list[tuple[int, int, int]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            samples.append(usage(pid))

    thread = threading.Thread(target=sample)
    thread.start()
    try:
        yield samples
    finally:
        done.set()
        thread.join()


def connect(path: Path, kind: str) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except OSError:  # the listen backlog is full: the kernel refused it, which is bounded too
        sock.close()
        return None
    if kind == "closed at once":
        sock.close()
        return None
    try:
        if kind == "half a hello":
            sock.send(b"\x40\x00")
        elif kind == "never reads":
            send_frame(sock, hello_body(Hello("flood")))
    except OSError:  # the gateway refused it already (past max_sessions) and closed it
        sock.close()
        return None
    return sock


def served(connector: ADPConnector, seed: int) -> bool:
    """One store, lookup and byte-exact load through the client connected before the flood."""
    data = bytearray(np.random.default_rng(seed).integers(0, 256, 2**20, np.uint8).tobytes())
    key = f"legit-{seed}"
    stored = wait_for_future(connector, connector.submit_batch_set([key], [memoryview(data)]))
    found = wait_for_future(connector, connector.submit_batch_exists([key]))
    into = bytearray(2**20)
    loaded = wait_for_future(connector, connector.submit_batch_get([key], [memoryview(into)]))
    return bool(stored[1]) and found[3] == [True] and loaded[3] == [True] and into == data


def test_a_flood_of_connections_leaves_the_gateway_bounded_and_serving(
    workdir: Path, make_gateway: Callable[..., Gateway], caplog: pytest.LogCaptureFixture
) -> None:
    (workdir / "gateway.yaml").write_text(CONFIG)
    gateway = make_gateway("256MiB", "--config", str(workdir / "gateway.yaml")).start()
    assert gateway.proc is not None
    pid = gateway.proc.pid
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    legit = ADPConnector(**gateway.adapter_params())
    try:
        connected(legit)
        assert served(legit, 0)
        threads0, fds0, rss0 = usage(pid)
        with sampled(pid) as samples:
            for wave in range(WAVES):
                kinds = [KINDS[i % len(KINDS)] for i in range(PER_WAVE)]
                held = [connect(gateway.socket_path, kind) for kind in kinds]
                assert served(legit, wave + 1), f"the client was not served in wave {wave}"
                for sock in held:
                    if sock is not None:
                        sock.close()
        threads, fds, rss = map(max, zip(*samples, strict=True))
        # One thread per handshake in progress (the flood is one uid's: its slots) and per
        # session (the connected client's one included), whatever came in; their fds; their
        # memory (each session's window is shared memory touched only where data moves).
        assert threads <= threads0 + PER_UID_MAX + MAX_SESSIONS, (threads0, threads)
        assert fds <= fds0 + 4 * (PER_UID_MAX + MAX_SESSIONS), (fds0, fds)
        assert rss <= rss0 + 64 * 2**20, (rss0, rss)
        log = gateway.log()
        assert 0 < log.count("refused client") < 50  # a flood is a few lines, not 1,000
        assert gateway.alive and served(legit, 99)
    finally:
        legit.close()
    wait_until(lambda: usage(pid)[0] <= threads0, 30, "the flood's sessions to end")
    newcomer = ADPConnector(**gateway.adapter_params())
    connected(newcomer)
    newcomer.close()


def test_one_client_past_max_sessions_is_refused_and_told_why(
    workdir: Path, make_gateway: Callable[..., Gateway], caplog: pytest.LogCaptureFixture
) -> None:
    (workdir / "gateway.yaml").write_text(CONFIG)
    gateway = make_gateway("256MiB", "--config", str(workdir / "gateway.yaml")).start()
    idle = []
    for count in range(1, MAX_SESSIONS + 1):  # clients that finish the handshake, then idle
        idle.append(connect(gateway.socket_path, "never reads"))
        wait_until(lambda: sessions(gateway) >= len(idle), 30, f"session {count}")
    ADPConnector(**gateway.adapter_params()).close()
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1 and "serves 8 clients already (max_sessions)" in refusals[0]
    for sock in idle:
        assert sock is not None
        sock.close()
    wait_until(lambda: gateway.log().count("closed:") >= MAX_SESSIONS, 30, "the sessions to end")
    client = ADPConnector(**gateway.adapter_params())
    connected(client)  # a freed session serves the next client
    client.close()


def sessions(gateway: Gateway) -> int:
    """Sessions the gateway has begun, from its log."""
    return gateway.log().count(" connected")


def test_a_dripping_handshake_is_dropped_at_its_deadline(
    workdir: Path, make_gateway: Callable[..., Gateway]
) -> None:
    """`handshake_timeout_s` bounds the whole handshake, not each read: a client that sends a
    frame length and then one byte every 0.3 s (each read well within 1 s) is dropped once
    1 s has passed since it connected."""
    (workdir / "gateway.yaml").write_text(CONFIG)
    gateway = make_gateway("256MiB", "--config", str(workdir / "gateway.yaml")).start()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(gateway.socket_path))
    started = time.monotonic()
    try:
        sock.send(b"\x00\x10\x00\x00")  # a 4 KiB frame is coming
        dropped = False
        while not dropped and time.monotonic() - started < 6:
            time.sleep(0.3)
            try:
                sock.send(b"\x00")
                dropped = bool(select.select([sock], [], [], 0)[0])  # the refusal, or EOF
            except OSError:
                dropped = True
        assert dropped, "the gateway kept a dripping handshake past its deadline"
        assert time.monotonic() - started < 3.0
    finally:
        sock.close()
    wait_until(lambda: "did not complete within handshake_timeout_s" in gateway.log(), 10, "log")


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to hold connections as another user")
def test_a_stranger_holding_handshakes_takes_only_its_own_slots(
    workdir: Path, make_gateway: Callable[..., Gateway]
) -> None:
    """Another user's process (uid nobody, not declared) holds twelve silent handshakes for as
    long as it may: only PER_UID_MAX of them get a slot, and the users the gateway knows (its
    own: `adp-gateway status` and a plugin here) still handshake at once."""
    workdir.chmod(0o755)  # let `nobody` reach the socket's directory
    (workdir / "gateway.yaml").write_text(
        "socket_group: nogroup\nhandshake_timeout_s: 60\nsession_window_size: 8MiB\n"
    )
    gateway = make_gateway(
        "256MiB", "--config", str(workdir / "gateway.yaml"), socket_path=group_socket(workdir)
    ).start()
    release_read, release_write = os.pipe()
    report_read, report_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(release_write)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            held = []
            for _ in range(12):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.connect(str(gateway.socket_path))
                held.append(sock)
            time.sleep(1.0)  # the gateway has refused the ones past the slots by now
            refused = sum(bool(select.select([s], [], [], 0)[0]) for s in held)
            os.write(report_write, str(refused).encode())
            os.read(release_read, 1)  # hold the rest until the parent is done
        finally:
            os._exit(0)
    os.close(report_write)
    os.close(release_read)
    try:
        refused = int(os.read(report_read, 16) or b"-1")
        assert refused == 12 - PER_UID_MAX
        result = subprocess.run(
            [str(BIN / "adp-gateway"), "status", "--socket", str(gateway.socket_path)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert result.returncode == 0, result.stderr
        client = ADPConnector(**gateway.adapter_params())
        connected(client)
        client.close()
        assert f"{PER_UID_MAX} handshakes of uid {NOBODY} are in progress already" in gateway.log()
    finally:
        os.close(release_write)
        os.close(report_read)
        os.waitpid(pid, 0)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to fill the queue as another user")
def test_a_client_connecting_while_the_accept_queue_is_full_waits_instead_of_failing(
    workdir: Path, make_gateway: Callable[..., Gateway]
) -> None:
    """A Unix socket with a timeout fails a connect at once (EAGAIN) while the listener's
    accept queue is full, as a stranger's flood leaves it on a gateway short of CPU: the plugin
    gave up and failed its ops. It now retries until its handshake deadline."""
    workdir.chmod(0o755)  # let `nobody` reach the socket's directory
    (workdir / "gateway.yaml").write_text("socket_group: nogroup\nsession_window_size: 8MiB\n")
    gateway = make_gateway(
        "256MiB", "--config", str(workdir / "gateway.yaml"), socket_path=group_socket(workdir)
    ).start()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    release_read, release_write = os.pipe()
    report_read, report_write = os.pipe()
    gateway.send_signal(signal.SIGSTOP)  # it accepts nothing: the queue fills
    pid = os.fork()
    if pid == 0:  # the child, a stranger: never returns into pytest
        try:
            os.close(release_write)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            queued = []
            while True:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.setblocking(False)
                try:
                    sock.connect(str(gateway.socket_path))
                except BlockingIOError:
                    break
                queued.append(sock)
            os.write(report_write, str(len(queued)).encode())
            os.read(release_read, 1)
        finally:
            os._exit(0)
    os.close(report_write)
    os.close(release_read)
    resumed = threading.Timer(0.5, lambda: gateway.send_signal(signal.SIGCONT))
    try:
        assert int(os.read(report_read, 16) or b"0") > 0  # the queue is full
        resumed.start()
        link = GatewayLink.connect(
            str(gateway.socket_path), Hello("default"), 5.0, frozenset({os.getuid()})
        )
        link.close()
    finally:
        resumed.cancel()
        gateway.send_signal(signal.SIGCONT)
        os.close(release_write)
        os.close(report_read)
        os.waitpid(pid, 0)


def test_clients_refused_past_max_sessions_leave_no_fd_of_their_l1_behind(
    workdir: Path, make_gateway: Callable[..., Gateway]
) -> None:
    (workdir / "gateway.yaml").write_text("max_sessions: 1\nsession_window_size: 8MiB\n")
    gateway = make_gateway("256MiB", "--config", str(workdir / "gateway.yaml")).start()
    assert gateway.proc is not None
    first = connect(gateway.socket_path, "never reads")
    wait_until(lambda: sessions(gateway) >= 1, 30, "the one session")
    baseline = usage(gateway.proc.pid)[1]
    segment = os.memfd_create("an-l1-segment")
    os.ftruncate(segment, 2**20)
    try:
        for _ in range(20):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.connect(str(gateway.socket_path))
                send_frame(sock, hello_body(Hello("t", l1_bytes=2**20)), [segment])
                assert b"max_sessions" in sock.recv(4096)
    finally:
        os.close(segment)
        if first is not None:
            first.close()
    wait_until(
        lambda: usage(gateway.proc.pid)[1] <= baseline,  # type: ignore[union-attr]
        10,
        f"the refused clients' fds to be closed (baseline {baseline})",
    )


def test_accepting_goes_on_once_the_gateway_that_ran_out_of_fds_has_some_again(
    workdir: Path, make_gateway: Callable[..., Gateway]
) -> None:
    (workdir / "gateway.yaml").write_text(CONFIG)
    gateway = make_gateway("256MiB", "--config", str(workdir / "gateway.yaml")).start()
    assert gateway.proc is not None
    pid = gateway.proc.pid
    try:
        limits = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (usage(pid)[1] + 1, limits[1]))
    except (OSError, ValueError) as exc:
        pytest.skip(f"cannot lower the gateway's fd limit here: {exc}")
    silent = [connect(gateway.socket_path, "silent") for _ in range(3)]  # the 2nd finds none
    time.sleep(0.3)  # well inside the handshake timeout that would free the 1st one's fd
    resource.prlimit(pid, resource.RLIMIT_NOFILE, limits)
    for sock in silent:
        if sock is not None:
            sock.close()
    client = ADPConnector(**gateway.adapter_params())
    try:
        connected(client)
    finally:
        client.close()
    assert "accepting a client failed ([Errno 24]" in gateway.log()  # it did run out
