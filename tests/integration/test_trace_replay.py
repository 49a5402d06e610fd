"""Goal: the trace replay benchmark (bench/trace_replay.py) keeps working: a small made-up trace
replayed through a real ``lmcache server`` with our plugin and a real gateway, and through
LMCache's fs_native with and without its own eviction, side by side or one after another, gives
a report where the L2 serves
hits, fs_native without eviction hits every reuse the trace has, nothing fails, and what the
gateway wrote is what it admitted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT
from tests.support.synthetic_trace import conversations, write_trace

pytestmark = pytest.mark.integration


def replay(tmp_path: Path, contenders: str, capacities: str, jobs: int = 1) -> dict[str, Any]:
    trace = write_trace(tmp_path / "trace.jsonl", conversations(12, 3, 3, 6.0, seed=5))
    out = tmp_path / "replay"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.trace_replay",
            str(trace),
            "--speed",
            "4",
            "--capacities",
            capacities,
            "--contenders",
            contenders,
            "--jobs",
            str(jobs),
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"| {capacities.split(',')[-1]} % |" in out.with_suffix(".md").read_text()
    result: dict[str, Any] = json.loads(out.with_suffix(".json").read_text())
    return result


def check(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    runs = {f"{r['contender']}@{r['capacity_percent']}": r for r in result["runs"]}
    for name, run in runs.items():
        assert run["failed_requests"] == 0, name
        assert run["drive_written_bytes"] > 0, name
    return runs


def test_a_small_trace_replays_through_each_l2(tmp_path: Path) -> None:
    result = replay(tmp_path, "ours,lmcache-lru,fs_native", "50", jobs=2)
    runs = check(result)
    unbounded = runs["fs_native@None"]
    trace = result["trace_summary"]
    reuses = trace["references"] - trace["distinct"]  # every reference but each block's first
    assert unbounded["hits"] == reuses and unbounded["l2_hit_blocks"] > 0
    ours = runs["ours@50.0"]
    assert 0 < ours["l2_hit_blocks"] <= ours["hits"] <= reuses
    assert ours["gateway"]["untaken_stores"] == 0  # a light load: the gateway takes every store
    admission = ours["gateway"]["admission"]
    assert admission["admitted"] > 0
    block_bytes = result["block_bytes"]
    assert ours["drive_written_bytes"] >= admission["admitted_bytes"] >= block_bytes


@pytest.mark.slow
def test_every_contender_at_two_capacities(tmp_path: Path) -> None:
    result = replay(tmp_path, "ours,gateway-lru,ours-budget,lmcache-lru,fs_native", "10,50")
    runs = check(result)
    budget = runs["ours-budget@50.0"]["write_budget_bytes_per_s"]
    assert budget and budget > 0
    assert (
        runs["ours-budget@50.0"]["drive_written_bytes"]
        < runs["gateway-lru@50.0"]["drive_written_bytes"]
    )
