"""Every helper and fixture the test suites and bench/ share; no test module imports another.

This module (standard library only, so that the scripts below also run from other venvs): real
processes for tests, a gateway, an LMCache MP server, LMCache's MP client run against one, and a
plugin's completion waiter. Beside it, one module per helper:

- ``plugin``: ADPConnector helpers (reach the gateway, seeded objects, where fragments go)
- ``storage``: a store over real or in-memory devices, for unit tests of the gateway's storage
- ``faulty_gateway``, ``leaky_gateway``, ``hostile_gateway``: a gateway with faults on command,
  with a planted leak, and another user's process standing in for it (run as scripts)
- ``mp_client``, ``many_clients_driver``, ``l2_roundtrip``, ``vllm_client``: LMCache's own
  clients and L2 adapter stack driven against a server (scripts, some run from other venvs)
- ``crash_driver``, ``crash_model``: the crash test's client process and its model
- ``corruption``: the corruption suite's images, map of on-disk structures and trials
- ``hostile_clients``: the hostile-client suite's strangers (run as a script)
- ``soak_client``, ``soak_controller``, ``soak_sampling``: the soak test's parts
- ``compat``: a venv per LMCache release; ``e2e_stack``, ``make_model``, ``run_vllm``: real vLLM
- ``docker_image``: the image under test; ``fuzz_parsers``: fuzz targets and their oracles

Every process is started in its own session and stopped (or killed) by the fixture that made it,
pass or fail. Waits are on conditions, each with a bound.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ["LMCACHE_TRACK_USAGE"] = "false"
os.environ["DO_NOT_TRACK"] = "1"
BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def short_tmpdir() -> Path:
    """A directory short enough for Unix socket paths (108 bytes)."""
    return Path(tempfile.mkdtemp(prefix="adp-", dir="/tmp"))


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


class Process:
    """A child process with its output in a log file."""

    def __init__(self, name: str, log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def spawn(
        self, argv: list[str], env: dict[str, str] | None = None, stdin: int | None = None
    ) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                argv,
                stdin=stdin,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
                cwd=ROOT,
            )

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def send_signal(self, signum: int) -> None:
        if self.alive:
            assert self.proc is not None
            os.killpg(self.proc.pid, signum)

    def stop(self, signum: int = signal.SIGTERM, timeout_s: float = 30) -> int | None:
        if self.proc is None:
            return None
        self.send_signal(signum)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return None
        finally:
            self._close_stdin()

    def kill(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
            self._close_stdin()

    def _close_stdin(self) -> None:
        if self.proc is not None and self.proc.stdin is not None:
            self.proc.stdin.close()


class Gateway(Process):
    stdin: int | None = None  # what the process reads

    def __init__(
        self,
        workdir: Path,
        capacity: str | None = "1GiB",  # None: the config's
        *extra: str,
        data_dir: Path | None = None,
        socket_path: Path | None = None,
    ) -> None:
        super().__init__("gateway", workdir / "gateway.log")
        self.data_dir = data_dir or workdir / "data"
        self.socket_path = socket_path or workdir / "gw.sock"
        self.args = [
            "--data-dir",
            str(self.data_dir),
            "--socket",
            str(self.socket_path),
            *(["--capacity", capacity] if capacity is not None else []),
            *extra,
        ]

    def argv(self) -> list[str]:
        return [str(BIN / "adp-gateway"), "serve", *self.args]

    def start(self, wait: bool = True) -> Gateway:
        mark = len(self.log())
        self.spawn(self.argv(), stdin=self.stdin)
        if wait:
            wait_until(
                lambda: "listening on" in self.log()[mark:] or not self.alive,
                60,
                "the gateway to listen",
            )
            assert self.alive, f"gateway exited:\n{self.log()}"
        return self

    def restart(self) -> Gateway:
        self.stop()
        return self.start()

    def adapter_params(self, **extra: Any) -> dict[str, Any]:
        return {"socket_path": str(self.socket_path), "op_timeout_s": 10.0, **extra}

    def l2_adapter_json(self, **extra: Any) -> str:
        return json.dumps(
            {
                "type": "native_plugin",
                "module_path": "lmcache_adp",
                "class_name": "ADPConnector",
                "adapter_params": self.adapter_params(**extra),
                "max_capacity_gb": 0,
            }
        )


class LMCacheServer(Process):
    def __init__(
        self,
        workdir: Path,
        l2_adapter_json: str,
        tag: str = "",
        bin_dir: Path = BIN,
        l1_size_gb: float = 1,
        shm_name: str | None = None,
        env: dict[str, str] | None = None,
        chunk_size: int = 256,
        flags: dict[str, str] | None = None,
    ) -> None:
        """``shm_name`` puts L1 in the shared-memory segment /dev/shm/NAME (``--shm-name``),
        which the plugin's zero-copy path uses; without it L1 is private memory. ``env`` is
        added to the server's environment; ``chunk_size`` is its tokens per chunk; ``flags``
        adds to (or replaces) its command-line flags."""
        super().__init__("lmcache server", workdir / f"lmcache-server{tag}.log")
        self.l1_size_gb = l1_size_gb
        self.chunk_size = chunk_size
        self.flags = flags or {}
        self.shm_name = shm_name
        self.port = free_port()
        self.http_port = free_port()
        self.l2_adapter_json = l2_adapter_json
        self.bin_dir = bin_dir
        self.env = env or {}

    def start(self) -> LMCacheServer:
        flags = {
            "--host": "localhost",
            "--port": str(self.port),
            "--http-port": str(self.http_port),
            "--l1-size-gb": str(self.l1_size_gb),
            "--eviction-policy": "LRU",
            "--chunk-size": str(self.chunk_size),
            "--supported-transfer-mode": "auto",
            "--l2-adapter": self.l2_adapter_json,
            **self.flags,
        }
        if self.shm_name is not None:
            flags["--shm-name"] = self.shm_name
        # The plugin is imported from this checkout, whichever venv runs the server.
        env = {**os.environ, "PYTHONPATH": str(ROOT), **self.env}
        argv = [str(self.bin_dir / "lmcache"), "server"]
        for flag, value in flags.items():
            argv += [flag, value]
        if self.shm_name is not None:
            argv.append("--no-l1-use-lazy")  # LMCache refuses shared memory with lazy L1
        self.spawn(argv, env=env)
        wait_until(lambda: self.healthy() or not self.alive, 120, "lmcache server health")
        assert self.alive, f"lmcache server exited:\n{self.log()[-4000:]}"
        return self

    def healthy(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.http_port}/healthcheck"
            with urllib.request.urlopen(url, timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def l2_settled(self) -> bool:
        """No L2 store of the server is waiting or in flight."""
        controller = self.status()["storage_manager"]["store_controller"]
        return int(controller["pending_keys_count"]) + int(controller["in_flight_task_count"]) == 0

    def clear_l1(self) -> None:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.http_port}/cache/clear", method="POST"
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200

    def status(self) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.http_port}/status"
        with urllib.request.urlopen(url, timeout=5) as response:
            return dict(json.load(response))

    def stop(self, signum: int = signal.SIGINT, timeout_s: float = 30) -> int | None:
        return super().stop(signum, timeout_s)


def wait_for_future(connector: Any, future_id: int, timeout_s: float = 30) -> tuple[Any, ...]:
    """Wait on the plugin's event fd the way LMCache does, until ``future_id`` completes.

    Completions of other futures seen meanwhile are kept in ``connector._test_seen``.
    """
    seen: dict[int, tuple[Any, ...]] = connector.__dict__.setdefault("_test_seen", {})
    deadline = time.monotonic() + timeout_s
    while future_id not in seen:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"future {future_id} did not complete in {timeout_s} s")
        ready, _, _ = select.select([connector.event_fd()], [], [], min(remaining, 0.5))
        if ready:
            for item in connector.drain_completions():
                seen[item[0]] = item
    return seen.pop(future_id)


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def session_resources(gateway: Gateway) -> tuple[int, int]:
    """The gateway's open fds and its mappings of session shared memory."""
    assert gateway.proc is not None
    pid = gateway.proc.pid
    maps = Path(f"/proc/{pid}/maps").read_text()
    return len(os.listdir(f"/proc/{pid}/fd")), maps.count("memfd:adp-session")


def run_mp_client(server: LMCacheServer, action: str, seed: int, *extra: str) -> int:
    """Run tests/support/mp_client.py (LMCache's MP client) against ``server``: its exit code."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.support.mp_client",
            "--port",
            str(server.port),
            "--http-port",
            str(server.http_port),
            "--timeout",
            "20",
            "--deadline",
            "90",
            action,
            "--seed",
            str(seed),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    print(result.stdout[-3000:], result.stderr[-1500:])
    return result.returncode


def store_then_load_from_l2(server: LMCacheServer, seed: int, chunks: str = "2") -> None:
    """Store chunks, wait for their L2 writes, empty L1, and check they come back from L2."""
    assert run_mp_client(server, "store", seed, "--chunks", chunks) == 0
    wait_until(server.l2_settled, 60, "the L2 stores to finish")
    server.clear_l1()
    assert run_mp_client(server, "check", seed, "--chunks", chunks, "--expect-tier", "l2") == 0
