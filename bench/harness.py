"""LMCache's own L2 benchmark harness (``lmcache bench l2``), one operation per process.

Stores run in one process and loads in a new one (``--only store``, then ``--only load``), so a
load never finds the bytes in the harness's memory. Each run is 1 warm-up and 2 measured rounds
of ``keys`` keys x 2 in flight, with 4 KiB-aligned L1 buffers (O_DIRECT back ends need them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from tests.support import BIN

IN_FLIGHT = 2
ROUNDS = 2
WARMUP_ROUNDS = 1


def bytes_per_phase(size_kb: int, keys: int) -> int:
    """Bytes one ``--only store`` (or load) run moves, warm-up included."""
    return (WARMUP_ROUNDS + ROUNDS) * IN_FLIGHT * keys * size_kb * 1024


def lmcache_bench(spec: str, only: str, size_kb: int, keys: int, out: Path) -> dict[str, Any]:
    """Run one operation; MiB/s as the harness reports it, and the keys it moved."""
    argv = [
        str(BIN / "lmcache"),
        "bench",
        "l2",
        "--l2-adapter",
        spec,
        "--only",
        only,
        "--l1-align-bytes",
        "4096",
        "--data-size-kb",
        str(size_kb),
        "--num-keys",
        str(keys),
        "--in-flight",
        str(IN_FLIGHT),
        "--rounds",
        str(ROUNDS),
        "--warmup-rounds",
        str(WARMUP_ROUNDS),
        "--format",
        "json",
        "--output",
        str(out),
    ]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        raise RuntimeError(
            f"lmcache bench l2 failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}"
        )
    metrics = json.loads(out.read_text())["metrics"]
    op = next(m for k, m in metrics.items() if k.startswith("op_"))
    if op["total_success"] != op["total_keys"]:
        raise RuntimeError(f"lmcache bench l2 --only {only}: not every key succeeded: {op}")
    return {"MiBps": op["throughput_avg_mbps"], "keys": op["total_keys"]}


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


def run_fs_native(directory: Path, size_kb: int, keys: int, odirect: bool) -> dict[str, Any]:
    """LMCache's fs_native on ``directory``: store, drop its files' page cache, load."""
    base, reports = directory / f"fs_native_{odirect}", directory / f"fs_native_{odirect}.out"
    base.mkdir()
    reports.mkdir()
    spec = json.dumps({"type": "fs_native", "base_path": str(base), "use_odirect": odirect})
    try:
        store = lmcache_bench(spec, "store", size_kb, keys, reports / "store.json")
        drop_file_cache(base)
        load = lmcache_bench(spec, "load", size_kb, keys, reports / "load.json")
        return {"store_MiBps": store["MiBps"], "load_MiBps": load["MiBps"]}
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(reports, ignore_errors=True)
