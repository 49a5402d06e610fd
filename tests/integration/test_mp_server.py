"""Goal: the stock `lmcache server` with our plugin persists KV chunks through the gateway: they
come back as L2 hits, byte-exact, after both the MP server and the gateway restart; the server
runs without the gateway and picks it up later; and a gateway killed or hung (SIGSTOP)
mid-traffic never stalls LMCache."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from adp_gateway.observe.status import ask
from tests.support import Gateway, LMCacheServer, run_mp_client, store_then_load_from_l2, wait_until

pytestmark = pytest.mark.integration
ROOT = Path(__file__).parents[2]


def test_chunks_come_back_from_l2_after_server_and_gateway_restart(
    gateway: Gateway, make_server: Callable[[str], LMCacheServer]
) -> None:
    server = make_server(gateway.l2_adapter_json()).start()
    assert run_mp_client(server, "store", 1, "--chunks", "4") == 0
    wait_until(server.l2_settled, 60, "the L2 stores to finish")
    assert server.stop() in (0, 130)  # 130: it exits by re-raising SIGINT
    gateway.restart()
    assert "recovered 4 objects" in gateway.log()
    server = make_server(gateway.l2_adapter_json()).start()
    assert run_mp_client(server, "check", 1, "--chunks", "4", "--expect-tier", "l2") == 0
    assert run_mp_client(server, "check", 2, "--chunks", "4") == 1  # never stored: a miss


def test_server_runs_without_the_gateway_and_uses_it_once_it_starts(
    make_gateway: Callable[..., Gateway], make_server: Callable[[str], LMCacheServer]
) -> None:
    gateway = make_gateway()
    params = {"reconnect_interval_s": 0.1, "reconnect_interval_max_s": 0.5}
    server = make_server(gateway.l2_adapter_json(**params)).start()
    assert run_mp_client(server, "check", 1, "--chunks", "2") == 1  # a miss, not a hang
    # The server's own output says why, once, with the path and the fix, at WARNING.
    warnings = re.findall(
        r"lmcache-adp WARNING: cannot reach the gateway at (\S+) .*", server.log()
    )
    assert warnings == [str(gateway.socket_path)], server.log()[-2000:]
    assert "adp-gateway serve --socket" in server.log()
    gateway.start()
    wait_until(lambda: "connected" in gateway.log(), 30, "the plugin to connect")
    wait_until(lambda: "lmcache-adp INFO: connected to the gateway" in server.log(), 10, "its line")
    store_then_load_from_l2(server, seed=1)


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "hung"])
def test_gateway_killed_or_hung_during_traffic_never_stalls_lmcache(
    gateway: Gateway, make_server: Callable[[str], LMCacheServer], signum: int
) -> None:
    timeout_s = 2.0
    server = make_server(
        gateway.l2_adapter_json(op_timeout_s=timeout_s, reconnect_interval_s=0.2)
    ).start()
    storing = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.mp_client",
            "--port",
            str(server.port),
            "--timeout",
            "20",
            "--deadline",
            "90",
            "store",
            "--seed",
            "1",
            "--chunks",
            "16",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    # The client is storing: once the first chunks have reached the gateway, more are on their
    # way when it dies or stops.
    wait_until(lambda: ask(str(gateway.socket_path))["objects"] > 0, 60, "L2 stores to land")
    gateway.send_signal(signum)
    assert storing.wait(90) == 0  # vLLM-side stores never depend on L2
    killed = time.monotonic()
    wait_until(server.l2_settled, timeout_s + 10, "in-flight L2 ops to complete")
    assert time.monotonic() - killed < timeout_s + 10
    assert run_mp_client(server, "check", 1, "--chunks", "16", "--expect-tier", "l1") == 0
    if signum == signal.SIGSTOP:
        gateway.send_signal(signal.SIGCONT)  # the same session carries on
    else:
        gateway.proc.wait(10)  # type: ignore[union-attr]
        gateway.start()
        wait_until(lambda: gateway.log().count("connected") >= 2, 30, "the plugin to reconnect")
    store_then_load_from_l2(server, seed=3)


def test_bad_adapter_param_stops_the_server_with_a_clear_error(
    gateway: Gateway, make_server: Callable[[str], LMCacheServer]
) -> None:
    server = make_server(gateway.l2_adapter_json(op_timeout="5"))
    with pytest.raises(AssertionError, match="exited"):
        server.start()
    assert "unknown key 'op_timeout'; did you mean 'op_timeout_s'" in server.log()
