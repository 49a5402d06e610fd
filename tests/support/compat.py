"""Helpers of the compatibility suite: a venv per LMCache release, LMCache's own harnesses run
from it, and a vLLM-like client (tests/support/vllm_client.py) against a running server."""

from __future__ import annotations

import functools
import json
import os
import re
import socket
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

from tests.support import BIN, ROOT, LMCacheServer, Process, free_port, wait_until

COMPAT_DIR = Path(os.environ.get("ADP_COMPAT_DIR", ROOT / ".venv-compat"))
MAIN_VERSION = "0.5.6"  # the release in .venv, which CI runs
ENV = {
    **os.environ,
    "PYTHONPATH": str(ROOT),  # the plugin and the client come from this checkout
    "LMCACHE_TRACK_USAGE": "false",
    "DO_NOT_TRACK": "1",
    "LMCACHE_DISABLE_BANNER": "1",
}


@functools.cache
def venv_bin(requirement: str) -> Path:
    """The bin directory of a venv holding ``requirement`` (``lmcache==V`` or
    ``lmcache-cli==V``), made by scripts/setup-compat.sh on first use. The main release is
    the project's own .venv."""
    if requirement == f"lmcache=={MAIN_VERSION}":
        return BIN
    result = subprocess.run(
        [str(ROOT / "scripts" / "setup-compat.sh"), requirement],
        capture_output=True,
        text=True,
        timeout=1200,
        env=ENV,
    )
    assert result.returncode == 0, f"setup-compat.sh {requirement}:\n{result.stderr[-3000:]}"
    return COMPAT_DIR / requirement.replace("==", "-") / "bin"


def run(argv: list[str], timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout_s, env=ENV, cwd=ROOT
    )


def tail(result: subprocess.CompletedProcess[str], chars: int = 3000) -> str:
    return f"exit {result.returncode}\n{result.stdout[-chars:]}\n{result.stderr[-chars:]}"


def basic_check(bin_dir: Path, spec: str) -> dict[str, tuple[int, int]]:
    """LMCache's own L2 adapter check (``python -m lmcache.v1.basic_check --mode
    test_l2_adapter``): lookups of absent keys, a store, lookups, loads compared byte for byte.
    Returns each row of its table as (passed, all), plus the content validation."""
    packages = list(bin_dir.parent.glob("lib/python3*/site-packages/lmcache"))
    module = "lmcache.v1.basic_check"  # from 0.5.7 on, lmcache.inprocess.v1.basic_check
    if packages and not (packages[0] / "v1" / "basic_check.py").exists():
        module = "lmcache.inprocess.v1.basic_check"
    result = run(
        [
            *(str(bin_dir / "python"), "-m", module),
            *("--mode", "test_l2_adapter", "--l2-adapter", spec),
        ]
    )
    assert result.returncode == 0, tail(result)
    rows = {
        name.strip(): (int(passed), int(total))
        for name, passed, total in re.findall(
            r"^\| ([A-Z][A-Z ()a-z]+?)\s+\|.*?\|\s+(\d+)/(\d+)\s+\|", result.stdout, re.M
        )
    }
    content = re.search(r"Validation \(content\): (\d+)/(\d+)", result.stdout)
    assert content is not None, tail(result)
    rows["content"] = (int(content[1]), int(content[2]))
    return rows


def bench_l2(bin_dir: Path, spec: str, out: Path, *args: str) -> dict[str, dict[str, Any]]:
    """``lmcache bench l2`` of that release: its metrics per operation (Store, Lookup, Load)."""
    result = run(
        [
            *(str(bin_dir / "lmcache"), "bench", "l2", "--l2-adapter", spec),
            *("--format", "json", "--output", str(out), *args),
        ],
        timeout_s=600,
    )
    assert result.returncode == 0, tail(result)
    metrics: dict[str, dict[str, Any]] = json.loads(out.read_text())["metrics"]
    return {m["operation"]: m for k, m in metrics.items() if k.startswith("op_")}


def client(
    bin_dir: Path, server: LMCacheServer, action: str, seed: int, *extra: str
) -> tuple[int, dict[str, Any]]:
    """tests/support/vllm_client.py run by ``bin_dir``'s Python: exit status, its JSON line."""
    result = run(
        [
            *(str(bin_dir / "python"), "-m", "tests.support.vllm_client"),
            *("--port", str(server.port), "--http-port", str(server.http_port)),
            *("--timeout", "30", "--deadline", "150", action, "--seed", str(seed), *extra),
        ],
        timeout_s=180,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    report: dict[str, Any] = json.loads(lines[-1]) if lines else {"output": tail(result)}
    print(f"client {action} seed {seed}: exit {result.returncode} {report}")
    if result.returncode == 2:
        print(tail(result))
    return result.returncode, report


def metric(server: LMCacheServer, name: str) -> dict[str, float]:
    """One counter or gauge of the server's /metrics, by its l2_name label ("" without one)."""
    url = f"http://127.0.0.1:{server.http_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    values: dict[str, float] = {}
    for labels, value in re.findall(rf"^{name}(?:{{([^}}]*)}})? (\S+)$", text, re.M):
        adapter = re.search(r'l2_name="([^"]*)"', labels or "")
        key = adapter[1] if adapter else ""
        values[key] = values.get(key, 0.0) + float(value)
    return values


class MultiAdapterServer(LMCacheServer):
    """An ``lmcache server`` given several ``--l2-adapter`` specs, in that order."""

    def __init__(
        self, workdir: Path, adapters: list[str], tag: str = "", bin_dir: Path = BIN
    ) -> None:
        super().__init__(workdir, adapters[0], tag=tag, bin_dir=bin_dir)
        self.adapters = adapters

    def start(self) -> MultiAdapterServer:
        argv = [
            *(str(self.bin_dir / "lmcache"), "server", "--host", "localhost"),
            *("--port", str(self.port), "--http-port", str(self.http_port)),
            *("--l1-size-gb", str(self.l1_size_gb), "--eviction-policy", "LRU"),
            *("--chunk-size", "256", "--supported-transfer-mode", "auto"),
        ]
        for spec in self.adapters:
            argv += ["--l2-adapter", spec]
        self.spawn(argv, env=ENV)
        wait_until(lambda: self.healthy() or not self.alive, 120, "lmcache server health")
        assert self.alive, f"lmcache server exited:\n{self.log()[-4000:]}"
        return self


class RedisServer(Process):
    """A redis-server (or valkey-server) of its own on a free port, nothing saved to disk."""

    def __init__(self, workdir: Path, binary: str) -> None:
        super().__init__("redis", workdir / "redis.log")
        self.binary = binary
        self.port = free_port()

    def start(self) -> RedisServer:
        self.spawn(
            [
                *(self.binary, "--port", str(self.port), "--bind", "127.0.0.1"),
                *("--save", "", "--appendonly", "no", "--dir", str(self.log_path.parent)),
            ]
        )
        wait_until(lambda: self.ping() or not self.alive, 30, "redis to answer PING")
        assert self.alive, f"redis exited:\n{self.log()}"
        return self

    def ping(self) -> bool:
        try:
            return self.command("PING") == "PONG"
        except OSError:
            return False

    def command(self, *words: str) -> str:
        """One command in RESP; the reply's first line without its type byte."""
        request = f"*{len(words)}\r\n" + "".join(f"${len(w)}\r\n{w}\r\n" for w in words)
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as connection:
            connection.sendall(request.encode())
            reply = connection.makefile("rb").readline().decode().rstrip("\r\n")
        return reply[1:]

    def spec(self) -> str:
        """LMCache's `resp` L2 adapter for this server (its C++ Redis client, in the wheel)."""
        return json.dumps(
            {"type": "resp", "host": "127.0.0.1", "port": self.port, "num_workers": 2}
        )


class TwoAdaptersServer(LMCacheServer):
    """``lmcache server`` as configs/two-adapters.sh launches it: our adapter and LMCache's
    `resp` adapter for the Redis at ``redis_port``."""

    def __init__(
        self, workdir: Path, socket_path: Path, redis_port: int, *flags: str, tag: str = ""
    ) -> None:
        super().__init__(workdir, "", tag=tag)
        self.script_args = [
            *("--port", str(self.port), "--http-port", str(self.http_port)),
            *("--l1-size-gb", str(self.l1_size_gb), "--socket", str(socket_path)),
            *("--redis-port", str(redis_port), "--redis-workers", "2", *flags),
        ]

    def start(self) -> TwoAdaptersServer:
        env = {**ENV, "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
        self.spawn([str(ROOT / "configs" / "two-adapters.sh"), *self.script_args], env=env)
        wait_until(lambda: self.healthy() or not self.alive, 120, "lmcache server health")
        assert self.alive, f"lmcache server exited:\n{self.log()[-4000:]}"
        return self
