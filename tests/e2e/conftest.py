"""Fixtures of the end-to-end suite: a tiny model built offline, and every process a test starts
stopped at its end, pass or fail, with a check that nothing it started is left behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.stack import E2E_BIN, ENV, HERE, Vllm
from tests.support import (
    Gateway,
    LMCacheServer,
    Process,
    remove_tree,
    short_tmpdir,
    wait_until,
)

SEEDS = (1, 2, 3, 4)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if not (E2E_BIN / "python").exists():
        skip = pytest.mark.skip(
            reason="no .venv-e2e: scripts/test.sh sets it up (scripts/setup-e2e.sh)"
        )
        for item in items:
            if "e2e" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def model_dir() -> Iterator[Path]:
    directory = short_tmpdir()
    subprocess.run(
        [str(E2E_BIN / "python"), str(HERE / "make_model.py"), str(directory / "m")],
        check=True,
        env=ENV,
        timeout=300,
    )
    yield directory / "m"
    remove_tree(directory)


class Stack:
    """Starts gateways, LMCache servers and vLLM engines, and remembers them all."""

    def __init__(self, workdir: Path, model: Path) -> None:
        self.workdir = workdir
        self.model = model
        self.processes: list[Process] = []

    def gateway(self) -> Gateway:
        gateway = Gateway(self.workdir, "2GiB")
        self.processes.append(gateway)
        return gateway.start()

    def server(self, gateway: Gateway, **params: object) -> LMCacheServer:
        server = LMCacheServer(
            self.workdir,
            gateway.l2_adapter_json(**params),
            tag=f"-{len(self.processes)}",
            bin_dir=E2E_BIN,
        )
        self.processes.append(server)
        return server.start()

    def vllm(self, server: LMCacheServer | None) -> Vllm:
        engine = Vllm(self.workdir, str(len(self.processes)))
        self.processes.append(engine)
        return engine.start(self.model, server.port if server else None)

    def stop_all(self) -> None:
        """Stop everything, then check that no process of theirs and no LMCache shm is left."""
        for process in reversed(self.processes):
            process.stop(signal.SIGKILL if process.name == "vllm" else signal.SIGTERM, 30)
        groups = [p.proc.pid for p in self.processes if p.proc is not None]
        for group in groups:  # workers, resource trackers: whatever a process left in its group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
        wait_until(lambda: not any(map(_group_alive, groups)), 30, "every process to be gone")


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def shared_memory_files() -> set[Path]:
    """What LMCache (lmcache_*) and vLLM's multiprocessing (psm_*, sem.mp-*) put in /dev/shm."""
    shm = Path("/dev/shm")
    return {p for pattern in ("lmcache_*", "psm_*", "sem.mp-*") for p in shm.glob(pattern)}


@pytest.fixture
def stack(model_dir: Path) -> Iterator[Stack]:
    workdir = short_tmpdir()
    before = shared_memory_files()
    stack = Stack(workdir, model_dir)
    try:
        yield stack
    finally:
        stack.stop_all()
        leaked = shared_memory_files() - before
        for path in leaked:
            path.unlink(missing_ok=True)
        remove_tree(workdir)
        assert not leaked, f"shared memory left behind: {sorted(map(str, leaked))}"


@pytest.fixture(scope="session")
def cold_outputs(model_dir: Path) -> dict[int, list[int]]:
    """Greedy output token ids of each seed's prompt with no KV connector at all."""
    workdir = short_tmpdir()
    engine = Vllm(workdir, "cold")
    try:
        engine.start(model_dir, None)
        return {seed: engine.request(seed)["output_token_ids"] for seed in SEEDS}
    finally:
        engine.stop()
        remove_tree(workdir)
