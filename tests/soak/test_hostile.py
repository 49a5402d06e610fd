"""Goal: no stranger on the host can make the gateway fail its users. While hostile clients run
in parallel (a user the config does not declare holding silent handshakes, dripping bytes,
flooding connections and sending every kind of wrong frame, and a declared client scribbling
garbage into its own ring), legitimate work through the real plugin succeeds every time:
`lmcache bench l2 --no-skip-verify` (LMCache's own harness, byte-verified), and a real
`lmcache server` with our plugin storing chunks, losing them from L1 and restoring them from
L2 byte-exact. The gateway never dies, `adp-gateway status` answers throughout, its threads
and fds come back to where they were once the strangers stop, and its log stays a few lines
per peer and reason every 10 s.

Needs root: the strangers run as `nobody` (slots are kept per uid, and a stranger's are its
own). CI runs it for ``SHORT_S`` seconds; ``-m slow`` for 10 minutes (``ADP_HOSTILE_SECONDS``
overrides both).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support import (
    BIN,
    ROOT,
    Gateway,
    LMCacheServer,
    store_then_load_from_l2,
    wait_until,
)
from tests.support.lmcache_bench import bench_l2_figures

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.getuid() != 0, reason="needs root to run the strangers as nobody"),
]
NOBODY = 65534  # uid of `nobody` and gid of `nogroup` on Debian
SHORT_S = 45.0
LONG_S = 600.0
STRANGERS = ("slow", "drip", "flood", "garbage")
REFUSAL_KINDS_MAX = 12  # kinds of refusal reason a stranger can draw (refusals.py folds by them)


def bench_l2(gateway: Gateway, out: Path) -> dict[str, Any]:
    """One run of LMCache's own harness through our plugin: its operations' figures."""
    return bench_l2_figures(
        gateway,
        out,
        *("--no-skip-verify", "--l1-align-bytes", "4096", "--data-size-kb", "256"),
        *("--num-keys", "32", "--lookup-max-hit-rate", "1"),
        timeout_s=300,
    )


def strangers(gateway: Gateway, seconds: float) -> list[subprocess.Popen[str]]:
    """The hostile clients, each a process of its own: four strangers, one declared client."""
    argv = [sys.executable, "-m", "tests.support.hostile_clients", "--socket"]
    argv += [str(gateway.socket_path), "--seconds", str(seconds)]
    started = []
    for seed, kind in enumerate(STRANGERS):
        who = ["--uid", str(NOBODY), "--gid", str(NOBODY)]
        started.append(_spawn([*argv, "--kind", kind, "--seed", str(seed), *who]))
    started.append(_spawn([*argv, "--kind", "ring", "--seed", "9"]))  # root: declared
    return started


def _spawn(argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def usage(gateway: Gateway) -> tuple[int, int]:
    assert gateway.proc is not None
    pid = gateway.proc.pid
    status = Path(f"/proc/{pid}/status").read_text()
    threads = int(next(line for line in status.splitlines() if line.startswith("Threads:"))[8:])
    return threads, len(os.listdir(f"/proc/{pid}/fd"))


def status_answers(gateway: Gateway) -> bool:
    result = subprocess.run(
        [str(BIN / "adp-gateway"), "status", "--socket", str(gateway.socket_path), "--json"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return result.returncode == 0 and json.loads(result.stdout)["ready"] is True


def storm(
    workdir: Path,
    make_gateway: Callable[..., Gateway],
    make_server: Callable[..., LMCacheServer],
    seconds: float,
) -> None:
    workdir.chmod(0o755)  # let `nobody` reach the socket's directory
    config = workdir / "gateway.yaml"
    config.write_text(
        "socket_group: nogroup\nhandshake_timeout_s: 2.0\n"
        "tenants:\n  - {name: default, uids: [0]}\n"
    )
    sockets = workdir / "sockets"  # made by the gateway, for the group
    gateway = make_gateway("1GiB", "--config", str(config), socket_path=sockets / "gw.sock")
    gateway.start()
    server = make_server(gateway.l2_adapter_json()).start()
    store_then_load_from_l2(server, seed=100)  # warm: every process has its session
    idle_threads, idle_fds = usage(gateway)
    hostile = strangers(gateway, seconds)
    runs: dict[str, int] = {"bench l2": 0, "lmcache server": 0}
    status_checked = False
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            ops = bench_l2(gateway, workdir / "bench.json")
            for name in ("Store", "Load", "Lookup"):
                assert ops[name]["total_success"] == ops[name]["total_keys"] > 0, ops[name]
            runs["bench l2"] += 1
            store_then_load_from_l2(server, seed=runs["lmcache server"])
            runs["lmcache server"] += 1
            if not status_checked:
                assert status_answers(gateway), "adp-gateway status was refused in the storm"
                status_checked = True
            assert gateway.alive, gateway.log()[-3000:]
    finally:
        did = []
        for process in hostile:
            out, err = process.communicate(timeout=seconds + 60)
            did.append(out.strip() or err[-2000:])
    print(f"\nhostile suite, {seconds:g} s: legitimate runs {runs}; hostile clients: {did}")
    assert all(process.returncode == 0 for process in hostile), did
    assert runs["bench l2"] >= 1 and runs["lmcache server"] >= 1
    wait_until(
        lambda: usage(gateway)[0] <= idle_threads + 1 and usage(gateway)[1] <= idle_fds + 2,
        30,
        "the gateway's threads and fds to come back once the strangers stopped",
    )
    refusals = gateway.log().count("refused client")
    assert refusals <= 2 * REFUSAL_KINDS_MAX * (seconds / 10 + 2), refusals
    assert status_answers(gateway)
    server.stop()


def test_legitimate_work_succeeds_while_strangers_attack(
    workdir: Path,
    make_gateway: Callable[..., Gateway],
    make_server: Callable[..., LMCacheServer],
) -> None:
    storm(workdir, make_gateway, make_server, float(os.environ.get("ADP_HOSTILE_SECONDS", SHORT_S)))


@pytest.mark.slow
def test_legitimate_work_succeeds_while_strangers_attack_long(
    workdir: Path,
    make_gateway: Callable[..., Gateway],
    make_server: Callable[..., LMCacheServer],
) -> None:
    storm(workdir, make_gateway, make_server, float(os.environ.get("ADP_HOSTILE_SECONDS", LONG_S)))
