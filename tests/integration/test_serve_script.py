"""Goal: the README's main command, scripts/serve.sh, brings up the gateway and `lmcache server`
with the plugin, ready for clients, and one Ctrl-C (SIGINT to its process group) stops both,
the server first and the gateway last, with what was stored persisted."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.integration.test_mp_server import mp_client
from tests.support import ROOT, LMCacheServer, wait_until

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("zero_copy", [False, True], ids=["copy", "zero-copy"])
def test_serve_script_runs_the_stack_and_ctrl_c_stops_it(workdir: Path, zero_copy: bool) -> None:
    server = LMCacheServer(workdir, "")  # only for its ports and client helpers
    log = workdir / "serve.log"
    argv = [
        str(ROOT / "scripts" / "serve.sh"),
        "--data-dir",
        str(workdir / "data"),
        "--capacity",
        "1GiB",
        "--port",
        str(server.port),
        "--http-port",
        str(server.http_port),
        "--l1-size-gb",
        "1",
        "--socket",
        str(workdir / "gw.sock"),
        *(["--zero-copy"] if zero_copy else []),
    ]
    env = {**os.environ, "ADP_EXTRAS": "test"}  # the test venv as it is: nothing to reinstall
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        wait_until(lambda: server.healthy() or proc.poll() is not None, 180, "the stack")
        assert proc.poll() is None, log.read_text()[-3000:]
        assert mp_client(server, "store", 9, "--chunks", "2") == 0
        wait_until(server.l2_settled, 60, "the L2 stores")
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in its terminal does
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    assert "closed: 0 loads (0 hits, 0 B), 2 stores" in text
    assert f"found), {2 if zero_copy else 0} of the stores zero-copy" in text
    assert text.index("Finished server process") < text.index("gateway stopped")
    result = subprocess.run(["pgrep", "-f", str(workdir / "gw.sock")], capture_output=True)
    assert result.stdout == b"", "a process of the stack is still running"
