"""LMCache's own L2 benchmark harness (``lmcache bench l2``), one operation per process.

Stores run in one process and loads in a new one (``--only store``, then ``--only load``), so a
load never finds the bytes in the harness's memory. L1 buffers are 4 KiB aligned
(``--l1-align-bytes 4096``), as in the server and as O_DIRECT back ends need.

Throughput is the harness's own timing: bytes of the measured rounds over the sum of their
durations (each round runs from its first submit until every submit has completed). CPU is read
from /proc for the harness process and any other process named (the gateway), from the line the
harness prints before its first round to the line it prints after its last, so start-up (torch
and LMCache imports, buffer allocation) is not counted; the warm-up round is, and its bytes too.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support import BIN, ROOT

TIMEOUT_S = 1800
# The directory holding the `lmcache` command: this venv's, or ADP_LMCACHE_BIN (a host whose
# lmcache lives elsewhere, such as bench/h200.sh's launcher that loads the GPU shim).
LMCACHE_BIN = Path(os.environ.get("ADP_LMCACHE_BIN", BIN))
MBPS_PER_MIBPS = 1.048576


@dataclass(frozen=True)
class Load:
    """One harness shape: ``in_flight`` submits of ``keys`` objects of ``size_kb`` per round."""

    size_kb: int
    keys: int
    in_flight: int
    rounds: int
    warmup_rounds: int = 1

    @property
    def round_bytes(self) -> int:
        return self.size_kb * 1024 * self.keys * self.in_flight

    def argv(self) -> list[str]:
        return [
            "--l1-align-bytes",
            "4096",
            "--data-size-kb",
            str(self.size_kb),
            "--num-keys",
            str(self.keys),
            "--in-flight",
            str(self.in_flight),
            "--rounds",
            str(self.rounds),
            "--warmup-rounds",
            str(self.warmup_rounds),
        ]


def lmcache_bench(
    spec: str, only: str, load: Load, out: Path, sample_pids: tuple[int, ...] = ()
) -> dict[str, Any]:
    """Run one operation. MB/s (10^6 bytes/s) of the keys that succeeded over the measured
    rounds, the fraction that did, and CPU seconds per GB of the harness process (``client``)
    and of each of ``sample_pids``."""
    argv = [str(LMCACHE_BIN / "lmcache"), "bench", "l2", "--l2-adapter", spec, "--only", only]
    argv += [*load.argv(), "--format", "json", "--output", str(out)]
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",  # so "Running" and the result banner arrive as printed
        "LMCACHE_DISABLE_BANNER": "1",
    }
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT
    )
    lines: list[str] = []
    started_at = 0.0  # wall clock of the first round
    before: list[float] | None = None
    after: list[float] | None = None
    assert proc.stdout is not None
    watchdog = threading.Timer(TIMEOUT_S, proc.kill)  # a hung harness must not hang the bench
    watchdog.start()
    try:
        for line in proc.stdout:
            lines.append(line)
            if before is None and "Running" in line:
                before = cpu_seconds_of((proc.pid, *sample_pids))
                started_at = time.time()
            elif after is None and "Benchmark Result" in line:
                after = cpu_seconds_of((proc.pid, *sample_pids))
        proc.wait(60)
    finally:
        watchdog.cancel()
    text = "".join(lines)
    if proc.returncode != 0 or before is None or after is None:
        raise RuntimeError(f"lmcache bench l2 --only {only} failed:\n{text[-3000:]}")
    op = next(m for k, m in json.loads(out.read_text())["metrics"].items() if k.startswith("op_"))
    if op["rounds_timed_out"]:
        raise RuntimeError(f"lmcache bench l2 --only {only}: rounds timed out: {op}")
    # A store may be refused (the adapter's back-pressure: LMCache then keeps the chunk in L1)
    # and a load then misses: only the bytes that moved count, and the fraction is reported.
    measured_bytes = op["total_success"] * load.size_kb * 1024
    seconds = op["duration_avg_ms"] / 1000 * (op["total_keys"] // (load.keys * load.in_flight))
    window_gb = (load.rounds + load.warmup_rounds) * load.round_bytes / 1e9
    cpu = [(a - b) / window_gb for a, b in zip(after, before, strict=True)]
    return {
        "MBps": measured_bytes / seconds / 1e6,
        "harness_MBps": op["throughput_avg_mbps"] * MBPS_PER_MIBPS,
        "keys": op["total_keys"],
        "succeeded": op["total_success"] / op["total_keys"],
        "started_at": started_at,
        "client_cpu_s_per_GB": cpu[0],
        "sampled_cpu_s_per_GB": cpu[1:],
    }


def cpu_seconds_of(pids: tuple[int, ...]) -> list[float]:
    """User + system CPU seconds each process (all its threads) has used so far."""
    ticks = os.sysconf("SC_CLK_TCK")
    seconds = []
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        seconds.append((int(fields[11]) + int(fields[12])) / ticks)
    return seconds


def drop_file_cache(directory: Path) -> None:
    """Flush and drop the page cache of every file under ``directory``."""
    for root, _, files in os.walk(directory):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
