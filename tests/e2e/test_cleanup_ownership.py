"""Goal: the suite cleans up only what it made. On a user's serving machine another `lmcache
server` keeps its L1 in /dev/shm/lmcache_l1_pool_* and vLLM its psm_* files; the end-to-end
stack's teardown (``owned_stack``, behind the ``stack`` fixture) must leave those untouched,
even when they appear while a test runs, and still remove and report what its own processes
leaked (here: the L1 segment of its own `lmcache server`, killed with SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import remove_tree, short_tmpdir, wait_until
from tests.support.e2e_stack import SHM, owned_stack

pytestmark = pytest.mark.e2e

# Another process on the host: it makes its segments and holds them mapped, as a live server
# does, until its stdin closes. It never removes them: that is the test's job afterwards.
FOREIGN = """
import mmap, os, sys
maps = []
for path in sys.argv[1:]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(fd, 1 << 20)
    maps.append(mmap.mmap(fd, 1 << 20))
    maps[-1][:8] = b"FOREIGN!"
print("ready", flush=True)
sys.stdin.read()
"""


class Foreign:
    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths
        self.proc = subprocess.Popen(
            [sys.executable, "-c", FOREIGN, *map(str, paths)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline() == "ready\n"
        self.inodes = {path: path.stat().st_ino for path in paths}

    def untouched(self) -> bool:
        return all(
            path.exists()
            and path.stat().st_ino == self.inodes[path]
            and path.read_bytes()[:8] == b"FOREIGN!"
            for path in self.paths
        )

    def end(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        self.proc.wait(30)
        self.proc.stdout.close()
        for path in self.paths:
            path.unlink(missing_ok=True)


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = short_tmpdir()
    yield path
    remove_tree(path)


def test_the_stack_teardown_removes_its_own_leak_and_never_another_process_files(
    workdir: Path,
) -> None:
    tag = f"{os.getpid()}-{time.monotonic_ns()}"
    foreign: Foreign | None = None
    try:
        with (
            pytest.raises(AssertionError, match="shared memory left behind") as failed,
            owned_stack(workdir, workdir / "no-model") as stack,
        ):
            # While the test runs, another process makes an L1 segment and a psm_ file.
            foreign = Foreign([SHM / f"lmcache_l1_pool_other-{tag}", SHM / f"psm_other{tag}"])
            server = stack.server(stack.gateway(), shared_l1=True)
            assert server.shm_name is not None
            own = SHM / f"lmcache_l1_pool_{server.shm_name}"
            wait_until(own.exists, 30, "the server's L1 segment")
            time.sleep(1)  # sampled at least once while it runs
            server.stop(signal.SIGKILL)  # it cannot remove its segment itself
            assert own.exists()
        report = str(failed.value)
        assert str(own) in report  # its own leak: reported
        assert not own.exists()  # and removed
        assert foreign is not None and foreign.untouched(), report
        assert "other" not in report, report
    finally:
        if foreign is not None:
            foreign.end()
