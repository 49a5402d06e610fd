"""Side-by-side L2 throughput: the disk's own O_DIRECT limit, lmcache-adp, and LMCache's fs_native.

    python -m bench.compare_l2 --dir /path/on/the/disk [--sizes-kb 256,4096,32768] [--keys 8]

Every adapter runs through LMCache's own harness (`lmcache bench l2`), stores in one process and
loads in a new one (`--only store`, then `--only load`), so loads are cold: lmcache-adp reads with
O_DIRECT after a gateway restart; fs_native's files get posix_fadvise(DONTNEED) in between.
lmcache-adp runs twice: with its default ``sync: always`` (a store is acknowledged after
fdatasync) and with ``sync: none``, which matches fs_native (it never syncs).
Writes ``bench/results/compare_l2.json`` and prints a markdown table (MB/s = 10^6 bytes/s).
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.support import BIN, Gateway

IO_BYTES = 4 * 2**20


def device_limit(directory: Path, total_bytes: int, threads: int = 4) -> dict[str, float]:
    """Sequential O_DIRECT write then read of ``total_bytes`` in 4 MiB I/Os, ``threads`` deep."""
    path = directory / "probe.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
    try:
        os.posix_fallocate(fd, 0, total_bytes)
        result = {}
        for name, call in (("write_GBps", os.pwritev), ("read_GBps", os.preadv)):
            offsets = list(range(0, total_bytes, IO_BYTES))
            started = time.perf_counter()
            workers = [
                threading.Thread(target=_io_worker, args=(fd, call, offsets[i::threads]))
                for i in range(threads)
            ]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            if call is os.pwritev:
                os.fdatasync(fd)
            result[name] = total_bytes / (time.perf_counter() - started) / 1e9
        return result
    finally:
        os.close(fd)
        path.unlink()


def _io_worker(fd: int, call: Any, offsets: list[int]) -> None:
    buf = memoryview(mmap.mmap(-1, IO_BYTES))
    buf[:] = os.urandom(1024) * (IO_BYTES // 1024)
    for offset in offsets:
        call(fd, [buf], offset)


def lmcache_bench(spec: str, only: str, size_kb: int, keys: int, out: Path) -> dict[str, Any]:
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
        "2",
        "--rounds",
        "2",
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
    assert op["total_success"] == op["total_keys"], op
    return {"MiBps": op["throughput_avg_mbps"], "keys": op["total_keys"]}


def drop_file_cache(directory: Path) -> None:
    for root, _, files in os.walk(directory):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)


def run_ours(directory: Path, size_kb: int, keys: int, sync: str) -> dict[str, Any]:
    workdir = directory / "adp"
    workdir.mkdir()
    (workdir / "gateway.yaml").write_text(f"sync: {sync}\n")
    gateway = Gateway(workdir, "12GiB", "--config", str(workdir / "gateway.yaml")).start()
    try:
        spec = gateway.l2_adapter_json(op_timeout_s=60.0)
        store = lmcache_bench(spec, "store", size_kb, keys, workdir / "s.json")
        cpu_store = _cpu_seconds(gateway)  # a fresh gateway process: all of it was the stores
        gateway.restart()
        load = lmcache_bench(spec, "load", size_kb, keys, workdir / "l.json")
        cpu_load = _cpu_seconds(gateway)
        moved_gb = store["keys"] * size_kb * 1024 / 1e9
        return {
            "store_MiBps": store["MiBps"],
            "load_MiBps": load["MiBps"],
            "gateway_cpu_s_per_GB_store": cpu_store / moved_gb,
            "gateway_cpu_s_per_GB_load": cpu_load / moved_gb,
        }
    finally:
        gateway.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _cpu_seconds(gateway: Gateway) -> float:
    assert gateway.proc is not None
    with open(f"/proc/{gateway.proc.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_fs_native(directory: Path, size_kb: int, keys: int, odirect: bool) -> dict[str, Any]:
    base = directory / f"fs_native_{odirect}"
    base.mkdir()
    spec = json.dumps({"type": "fs_native", "base_path": str(base), "use_odirect": odirect})
    try:
        store = lmcache_bench(spec, "store", size_kb, keys, directory / "s.json")
        drop_file_cache(base)
        load = lmcache_bench(spec, "load", size_kb, keys, directory / "l.json")
        return {"store_MiBps": store["MiBps"], "load_MiBps": load["MiBps"]}
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--sizes-kb", default="256,4096,32768")
    parser.add_argument("--keys", type=int, default=8, help="keys per submit (2 in flight)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/compare_l2.json"))
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    for size_kb in map(int, args.sizes_kb.split(",")):
        total = 3 * 2 * args.keys * size_kb * 1024  # (warmup + 2 rounds) x 2 in flight
        row: dict[str, Any] = {"size_kb": size_kb, "bytes_per_phase": total}
        row["device"] = device_limit(args.dir, max(total, 256 * 2**20))
        row["lmcache_adp"] = run_ours(args.dir, size_kb, args.keys, "always")
        row["lmcache_adp_sync_none"] = run_ours(args.dir, size_kb, args.keys, "none")
        row["fs_native_odirect"] = run_fs_native(args.dir, size_kb, args.keys, True)
        row["fs_native_buffered"] = run_fs_native(args.dir, size_kb, args.keys, False)
        results.append(row)
        print(json.dumps(row), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": " ".join(sys.argv), "results": results}, indent=1))
    print(table(results))
    return 0


def table(results: list[dict[str, Any]]) -> str:
    """Markdown: MB/s of each contender, then ours over the disk and over fs_native O_DIRECT."""
    columns = ("lmcache_adp", "lmcache_adp_sync_none", "fs_native_odirect", "fs_native_buffered")
    lines = [
        "| object | op | disk O_DIRECT | lmcache-adp | adp, sync none | fs_native O_DIRECT "
        "| fs_native buffered | adp / disk | adp / fs_native O_DIRECT |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results:
        for op, device_key in (("store", "write_GBps"), ("load", "read_GBps")):
            disk = row["device"][device_key] * 1e3
            mbps = [row[c][f"{op}_MiBps"] * 1.048576 for c in columns]
            cells = " | ".join(f"{v:.0f}" for v in [disk, *mbps])
            size = row["size_kb"]
            label = f"{size // 1024} MiB" if size >= 1024 else f"{size} KiB"
            ratios = f"{mbps[0] / disk:.2f} | {mbps[0] / mbps[2]:.2f}"
            lines.append(f"| {label} | {op} | {cells} | {ratios} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
