"""Goal: an operator can see what a running gateway does and check a deployment end to end.

- The gateway's Prometheus metrics agree with LMCache's own ``lmcache_mp_l2_*`` counters for
  the same traffic (a real ``lmcache server`` with our plugin, driven by LMCache's client):
  chunks stored, chunks looked up, chunks loaded from L2. ``/healthz`` and ``/readyz`` answer.
- ``adp-gateway status`` reports a running gateway (capacity, objects, sessions, tenants,
  databases, the last minute's rates), as lines in plain words or JSON, at ``--socket`` or
  ``$ADP_SOCKET``.
- ``adp-gateway verify`` restores a synthetic prompt through a running server byte-exact
  (exit 0), and says so, exiting 1, when L2 cannot give it back.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from adp_gateway.observe.metrics import SCRAPES_MAX, Metrics, MetricsServer
from adp_gateway.observe.status import ask, describe, render
from tests.support import (
    BIN,
    Gateway,
    LMCacheServer,
    free_port,
    store_then_load_from_l2,
    wait_until,
)

pytestmark = pytest.mark.integration


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def total(text: str, name: str, **labels: str) -> float:
    """The sum of every sample of ``name`` whose labels include ``labels``."""
    found = 0.0
    for line in text.splitlines():
        match = re.match(rf"^{name}(?:\{{(.*)\}})? (\S+)$", line)
        if match is None:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            found += float(match.group(2))
    return found


def lmcache_total(text: str, counter: str) -> float:
    """An LMCache counter, whatever unit suffix its OpenTelemetry exporter gave it."""
    names = set(re.findall(rf"^(lmcache_mp_{counter}(?:_[a-z]+)?_total)\b", text, re.M))
    assert len(names) == 1, (counter, names)
    return total(text, names.pop())


@pytest.fixture
def observed(make_gateway: Callable[..., Gateway]) -> Gateway:
    return make_gateway("1GiB", "--metrics-address", f"127.0.0.1:{free_port()}").start()


def metrics_url(gateway: Gateway, path: str = "/metrics") -> str:
    address = gateway.args[gateway.args.index("--metrics-address") + 1]
    return f"http://{address}{path}"


def test_metrics_agree_with_lmcache_counters_for_the_same_traffic(
    observed: Gateway, make_server: Callable[[str], LMCacheServer]
) -> None:
    assert scrape(metrics_url(observed, "/healthz")) == "alive\n"
    assert scrape(metrics_url(observed, "/readyz")) == "ready\n"
    server = make_server(observed.l2_adapter_json()).start()
    store_then_load_from_l2(server, seed=5, chunks="4")  # 4 stored, cleared from L1, loaded
    ours = scrape(metrics_url(observed))
    theirs = scrape(f"http://127.0.0.1:{server.http_port}/metrics")

    stored = lmcache_total(theirs, "l2_store_completed_objects")
    assert stored == 4 == total(ours, "adp_gateway_keys_total", op="store", outcome="ok")
    looked_up = lmcache_total(theirs, "l2_prefetch_lookup_objects")
    assert looked_up == total(ours, "adp_gateway_keys_total", op="lookup") > 0
    loaded = lmcache_total(theirs, "l2_prefetch_load_completed")
    assert loaded == 4 == total(ours, "adp_gateway_keys_total", op="load", outcome="hit")
    assert (
        total(ours, "adp_gateway_written_bytes_total")
        == total(ours, "adp_gateway_read_bytes_total")
        > 0
    )
    assert total(ours, "adp_gateway_sessions", tenant="default") == 1
    assert total(ours, "adp_gateway_objects") == 4
    assert total(ours, "adp_gateway_op_duration_seconds_count", op="load") == 4
    assert total(ours, "adp_gateway_used_bytes") <= total(ours, "adp_gateway_capacity_bytes")


def test_readyz_is_503_until_the_gateway_serves_and_healthz_once_it_is_stuck() -> None:
    serving, living = False, True
    address = f"127.0.0.1:{free_port()}"
    server = MetricsServer(address, Metrics(), lambda: serving, lambda: living)
    server.start()
    try:
        url = f"http://{address}"
        with pytest.raises(urllib.error.HTTPError, match="503"):
            scrape(f"{url}/readyz")
        assert scrape(f"{url}/healthz") == "alive\n"
        serving = True
        assert scrape(f"{url}/readyz") == "ready\n"
        living = False
        with pytest.raises(urllib.error.HTTPError, match="503"):
            scrape(f"{url}/healthz")
    finally:
        server.stop()


def adp_gateway(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "adp-gateway"), *args], capture_output=True, text=True, timeout=300, env=env
    )


def test_status_reports_a_running_gateway(
    gateway: Gateway, make_server: Callable[[str], LMCacheServer]
) -> None:
    server = make_server(gateway.l2_adapter_json()).start()
    store_then_load_from_l2(server, seed=6, chunks="2")
    done = adp_gateway("status", "--socket", str(gateway.socket_path), "--json")
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    assert status["ready"] and status["objects"] == 2 and status["sessions"] == {"default": 1}
    assert status["databases"][0]["health"] == "ok"
    assert 0 < status["used_bytes"] <= status["capacity_bytes"]
    assert set(status["rates_last_minute"]) >= {"store_keys", "written_bytes"}
    # In plain words; and $ADP_SOCKET (which the image sets) stands in for --socket.
    environment = {**os.environ, "ADP_SOCKET": str(gateway.socket_path)}
    lines = adp_gateway("status", env=environment).stdout
    assert "ready" in lines and "2 objects" in lines and "1 of tenant 'default'" in lines
    assert re.search(
        r"tenant 'default': 1 session, uses \d+ MiB of disk \(whole regions\) of the "
        r"\d+(\.\d)? [MG]iB it may use",
        lines,
    ), lines
    assert ".0 " not in lines and " 1 sessions" not in lines, lines

    absent = adp_gateway("status", "--socket", str(gateway.socket_path) + ".nothing")
    assert absent.returncode == 2 and "no gateway answers at" in absent.stderr


def test_status_of_an_older_gateway_names_what_it_lacks_and_shows_it_whole(
    gateway: Gateway,
) -> None:
    """A gateway still running from before an upgrade answers without keys this client reads:
    the lines say which one is missing and show the status as JSON, rather than a KeyError."""
    status = ask(str(gateway.socket_path))
    assert describe(status) == render(status)  # this gateway's status has every key
    del status["io_threads"]  # as a gateway from before elastic I/O threads answers
    del status["at_io_thread_share"]
    shown = describe(status)
    assert shown.startswith(
        "this gateway's status has no at_io_thread_share, io_threads (the gateway is older"
    )
    assert json.loads(shown.split("\n", 1)[1]) == status


def test_verify_restores_through_a_running_server_or_says_it_could_not(
    gateway: Gateway, make_server: Callable[[str], LMCacheServer]
) -> None:
    server = make_server(gateway.l2_adapter_json(op_timeout_s=2.0)).start()
    target = ["--lmcache", f"tcp://localhost:{server.port}"]
    target += ["--http", f"http://localhost:{server.http_port}"]
    done = adp_gateway("verify", *target, "--tokens", "1024")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 of 4 chunks from L2" in done.stdout and "byte-exact" in done.stdout

    gateway.stop()  # L2 is gone: the prompt cannot come back from it
    failed = adp_gateway("verify", *target, "--tokens", "1024")
    assert failed.returncode == 1 and "NOT RESTORED" in failed.stdout, failed.stdout
    wait_until(server.healthy, 10, "the server, still serving from L1")


def test_a_bad_metrics_address_is_named(
    make_gateway: Callable[..., Gateway], workdir: Path
) -> None:
    done = adp_gateway(
        "serve", "--data-dir", str(workdir / "d"), "--socket", str(workdir / "s.sock"),
        "--capacity", "256MiB", "--metrics-address", "localhost",
    )  # fmt: skip
    assert done.returncode == 2 and "metrics_address: 'localhost' is not HOST:PORT" in done.stderr


def threads_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    return int(dict(line.split(":", 1) for line in status)["Threads"])


def test_idle_connections_to_the_metrics_port_hold_few_threads_and_scrapes_go_on(
    observed: Gateway,
) -> None:
    """Any local user can reach the port: 100 connections that send nothing hold at most
    SCRAPES_MAX threads, and once they are gone a scrape is answered."""
    assert observed.proc is not None
    host, port = metrics_url(observed).split("/")[2].split(":")
    before = threads_of(observed.proc.pid)
    idle = [socket.create_connection((host, int(port))) for _ in range(100)]
    try:
        time.sleep(0.5)
        assert threads_of(observed.proc.pid) <= before + SCRAPES_MAX
    finally:
        for sock in idle:
            sock.close()
    wait_until(lambda: "adp_gateway" in scrape(metrics_url(observed)), 30, "a scrape")
