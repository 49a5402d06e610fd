"""Helpers of the compatibility suite: a venv per LMCache release, LMCache's own harnesses run
from it, and a vLLM-like client (tests/compat/vllm_client.py) against a running server."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

from tests.support import BIN, ROOT, LMCacheServer

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
    result = run(
        [
            *(str(bin_dir / "python"), "-m", "lmcache.v1.basic_check"),
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
    """tests/compat/vllm_client.py run by ``bin_dir``'s Python: exit status, its JSON line."""
    result = run(
        [
            *(str(bin_dir / "python"), "-m", "tests.compat.vllm_client"),
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
