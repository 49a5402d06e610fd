"""Goal: trust both ways. The plugin tells nothing to a gateway it cannot trust: one run by
another user (SO_PEERCRED), or one behind a socket whose directory, or a parent of it, another
user can write or a symlink points to; it says so in one error line, fails its ops at once, and
LMCache keeps serving from L1. The gateway refuses to start in a socket directory another user
owns or can write, and neither side runs on a CPU whose memory model the rings are not for.

The hostile gateway is a real process of another user (uid 65534, "nobody"), which records what
it was sent (tests/support/hostile_gateway.py); these tests need root to make one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from adp_gateway.errors import UnsupportedHost
from adp_wire.ring.queue import check_host
from lmcache_adp import ADPConnector
from tests.support import BIN, Gateway, Process, wait_for_future, wait_until
from tests.support.plugin import connected

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="making another user's gateway needs root"),
]
NOBODY = 65534


class HostileGateway(Process):
    def __init__(self, workdir: Path, socket_path: Path) -> None:
        super().__init__("hostile gateway", workdir / "hostile.log")
        self.socket_path = socket_path

    def start(self) -> HostileGateway:
        argv = [sys.executable, "-m", "tests.support.hostile_gateway"]
        self.spawn([*argv, str(self.socket_path), str(NOBODY)])
        wait_until(lambda: "listening" in self.log() or not self.alive, 30, "the hostile gateway")
        assert self.alive, self.log()
        return self

    def received(self) -> list[str]:
        return [line for line in self.log().splitlines() if line.startswith("received")]


@pytest.fixture
def hostile(workdir: Path) -> Iterator[HostileGateway]:
    (workdir / "run").mkdir(mode=0o755)
    gateway = HostileGateway(workdir, workdir / "run" / "gw.sock").start()
    yield gateway
    gateway.kill()


def plugin_log(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "lmcache_adp"]


def test_a_gateway_run_by_another_user_hears_nothing(
    hostile: HostileGateway, caplog: pytest.LogCaptureFixture
) -> None:
    connector = ADPConnector(socket_path=str(hostile.socket_path), op_timeout_s=10.0)
    try:
        item = wait_for_future(connector, connector.submit_batch_exists(["k"]), timeout_s=2)
        assert item[1] is False  # at once, not at the deadline: there is no link
        refusals = [m for m in plugin_log(caplog) if "refusing the gateway" in m]
        assert len(refusals) == 1 and f"runs as uid {NOBODY}" in refusals[0]
        assert "gateway_uids" in refusals[0]  # the fix is named
    finally:
        connector.close()
    assert all(line == "received 0 bytes and 0 fds" for line in hostile.received())

    # Told to trust that uid, the same plugin does send its hello: the check is what held it.
    trusting = ADPConnector(socket_path=str(hostile.socket_path), gateway_uids=[NOBODY])
    trusting.close()
    wait_until(lambda: hostile.received()[-1:] != ["received 0 bytes and 0 fds"], 10, "a hello")


@pytest.mark.parametrize("flaw", ["writable by others", "parent of another user", "symlink"])
def test_a_socket_others_could_have_put_there_is_refused(
    gateway: Gateway, workdir: Path, caplog: pytest.LogCaptureFixture, flaw: str
) -> None:
    real = gateway.socket_path
    if flaw == "writable by others":
        os.chmod(real.parent, 0o777)
        path = real
    elif flaw == "parent of another user":
        theirs = workdir / "theirs"
        (theirs / "ours").mkdir(parents=True, mode=0o700)
        os.chown(theirs, NOBODY, NOBODY)
        path = theirs / "ours" / "gw.sock"
        os.symlink(real, path)  # the plugin never gets as far as the socket itself
    else:
        (workdir / "link").symlink_to(real.parent)
        path = workdir / "link" / real.name
    connector = ADPConnector(socket_path=str(path))
    try:
        item = wait_for_future(connector, connector.submit_batch_exists(["k"]), timeout_s=2)
        assert item[1] is False
        refusals = [m for m in plugin_log(caplog) if "refusing the gateway" in m]
        assert len(refusals) == 1, plugin_log(caplog)
        assert {
            "writable by others": "writable by other users",
            "parent of another user": f"owned by uid {NOBODY}",
            "symlink": "is a symlink",
        }[flaw] in refusals[0]
    finally:
        connector.close()
    assert "connected" not in gateway.log().split("listening on", 1)[1]  # no hello reached it

    os.chmod(real.parent, 0o700)  # the same gateway, trusted, is used at once
    good = ADPConnector(socket_path=str(real))
    connected(good)
    good.close()


@pytest.mark.parametrize(
    "flaw", ["writable by others", "owned by another user", "a parent writable by others"]
)
def test_the_gateway_refuses_a_socket_directory_others_control(workdir: Path, flaw: str) -> None:
    """Where its plugins would refuse it (lmcache_adp/trust.py): a parent that others may
    write, without the sticky bit, is refused as the directory itself is."""
    directory = workdir / "sockets"
    directory.mkdir(mode=0o700)
    if flaw == "writable by others":
        os.chmod(directory, 0o777)
    elif flaw == "owned by another user":
        os.chown(directory, NOBODY, NOBODY)
    else:
        os.chmod(workdir, 0o777)
    argv = [str(BIN / "adp-gateway"), "serve", "--data-dir", str(workdir / "data")]
    argv += ["--socket", str(directory / "gw.sock"), "--capacity", "256MiB"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    expected = {
        "writable by others": f"{directory} is writable by other users",
        "owned by another user": "belongs to uid",
        "a parent writable by others": f"{workdir} (holding the gateway's socket",
    }[flaw]
    assert expected in done.stderr and "--socket" in done.stderr, done.stderr
    assert not (workdir / "data").exists()  # refused before any database was made


def test_neither_side_runs_where_the_cpu_may_reorder_stores() -> None:
    check_host("x86_64")
    with pytest.raises(UnsupportedHost, match=r"aarch64.*x86-64"):
        check_host("aarch64")
