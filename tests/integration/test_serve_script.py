"""Goal: the README's main command, scripts/serve.sh, brings up the gateway and `lmcache server`
with the plugin, ready for clients, with the gateway's metrics at the URL its ready block gives,
and one Ctrl-C (SIGINT to its process group) stops both, the server first and the gateway last,
with what was stored persisted and its log directory gone. A stack that cannot start says so
once, keeping its logs."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest

from tests.support import ROOT, LMCacheServer, free_port, run_mp_client, wait_until

pytestmark = pytest.mark.integration


def serve(
    workdir: Path, server: LMCacheServer, log: Path, *extra: str, **env_extra: str
) -> subprocess.Popen[bytes]:
    """scripts/serve.sh on ``server``'s ports, with its output in ``log``."""
    argv = [str(ROOT / "scripts" / "serve.sh"), "--data-dir", str(workdir / "data")]
    argv += ["--capacity", "1GiB", "--port", str(server.port), "--http-port"]
    argv += [str(server.http_port), "--l1-size-gb", "1", "--socket", str(workdir / "gw.sock")]
    if "--no-metrics" not in extra:  # never the default port: another stack may have it
        argv += ["--metrics-address", f"127.0.0.1:{free_port()}"]
    # ADP_EXTRAS: the test venv as it is; TMPDIR: its log directory in the test's own workdir.
    env = {**os.environ, "ADP_EXTRAS": "test", "TMPDIR": str(workdir), **env_extra}
    with open(log, "wb") as out:
        return subprocess.Popen(
            [*argv, *extra],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=at_a_terminal,
        )


def at_a_terminal() -> None:
    """SIGINT as a terminal's shell gives it: a shell started with SIGINT ignored (as a job
    started in the background of a non-interactive shell is) cannot trap it, and CI may start
    the tests so."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def ready(proc: subprocess.Popen[bytes], log: Path) -> bool:
    return "Logs (removed at a clean stop)" in log.read_text() or proc.poll() is not None


def log_dirs(workdir: Path) -> list[Path]:
    return sorted(workdir.glob("adp-serve.*"))


@pytest.mark.parametrize("zero_copy", [False, True], ids=["copy", "zero-copy"])
def test_serve_script_runs_the_stack_and_ctrl_c_stops_it(workdir: Path, zero_copy: bool) -> None:
    """L1 in shared memory (the default, here with --huge-pages on a copy of the host's shmem
    setting), or private (--private-l1)."""
    server = LMCacheServer(workdir, "")  # only for its ports and client helpers
    log = workdir / "serve.log"
    shmem = workdir / "shmem_enabled"
    shmem.write_text("always within_size advise [never] deny force\n")
    extra = ["--huge-pages"] if zero_copy else ["--private-l1"]
    proc = serve(workdir, server, log, *extra, ADP_SHMEM_SETTING=str(shmem))
    try:
        wait_until(lambda: ready(proc, log), 180, "the stack")
        assert proc.poll() is None, log.read_text()[-3000:]
        assert server.healthy()  # ready means serving, not starting
        # The ready block gives the gateway's metrics URL, and it serves them there.
        [url] = re.findall(r"Gateway metrics: (http://\S+/metrics)", log.read_text())
        with urllib.request.urlopen(url, timeout=10) as response:
            assert "adp_gateway_sessions" in response.read().decode()
        assert len(log_dirs(workdir)) == 1
        smoke = subprocess.run(
            [str(ROOT / "scripts" / "smoke.sh"), "--socket", str(workdir / "gw.sock")],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "ADP_EXTRAS": "test"},
        )
        assert smoke.returncode == 0, smoke.stdout + smoke.stderr
        assert "every byte loaded back matches" in smoke.stdout
        said = (smoke.stdout + smoke.stderr).splitlines()  # its own lines, nothing of the bench's
        assert [line for line in said if not line.startswith(("smoke.sh: ", "setup-env: "))] == []
        assert run_mp_client(server, "store", 9, "--chunks", "2") == 0
        wait_until(server.l2_settled, 60, "the L2 stores")
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in its terminal does
        assert proc.wait(60) == 0, log.read_text()[-3000:]  # which path it took
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    assert "1GiB preallocated in" in text  # the ready line says what it took, and where
    assert (shmem.read_text().strip() == "advise") == zero_copy
    assert ("shmem_enabled: never -> advise" in text) == zero_copy
    assert "closed: 0 loads (0 hits, 0 B), 2 stores" in text
    assert f"found), {2 if zero_copy else 0} of the stores zero-copy" in text
    assert text.index("Finished server process") < text.index("gateway stopped")
    result = subprocess.run(["pgrep", "-f", str(workdir / "gw.sock")], capture_output=True)
    assert result.stdout == b"", "a process of the stack is still running"
    assert log_dirs(workdir) == [], "a clean stop leaves its log directory behind"


def test_a_second_serve_script_fails_saying_the_error_once(workdir: Path) -> None:
    server = LMCacheServer(workdir, "")
    first = serve(workdir, server, workdir / "first.log")
    try:
        wait_until(lambda: ready(first, workdir / "first.log"), 180, "the first stack")
        assert first.poll() is None
        second = serve(workdir, server, workdir / "second.log", "--no-metrics")
        assert second.wait(120) == 1
        said = (workdir / "second.log").read_text()
        assert said.count("already served by a live gateway") == 1, said
        lines = [line for line in said.splitlines() if line.startswith("serve.sh:")]
        assert len(lines) == 1 and "the gateway did not start" in lines[0], lines
        [kept] = [d for d in log_dirs(workdir) if str(d) in lines[0]]  # named, and kept
        assert "already served by a live gateway" in (kept / "gateway.log").read_text()
        assert first.poll() is None and server.healthy()  # the first one is untouched
    finally:
        os.killpg(first.pid, signal.SIGINT)
        first.wait(60)
    assert log_dirs(workdir) == [kept]  # the first one's, removed at its clean stop


def test_a_process_that_exits_while_serving_stops_the_stack_and_says_so(workdir: Path) -> None:
    server = LMCacheServer(workdir, "")
    log = workdir / "serve.log"
    proc = serve(workdir, server, log)
    try:
        wait_until(lambda: ready(proc, log), 180, "the stack")
        assert proc.poll() is None, log.read_text()[-3000:]
        gateway = subprocess.run(
            ["pgrep", "-f", f"adp-gateway serve .*{workdir / 'gw.sock'}"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        [pid] = gateway.stdout.split()  # the one this test's serve.sh started, on its socket
        os.kill(int(pid), signal.SIGKILL)
        assert proc.wait(60) == 1
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    lines = [line for line in log.read_text().splitlines() if line.startswith("serve.sh:")]
    assert "the gateway exited (status 137) while serving" in lines[-1], lines
    assert not server.healthy()  # the server was stopped with it
    assert [d for d in log_dirs(workdir) if str(d) in lines[-1]]  # named, and kept
