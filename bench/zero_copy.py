"""Zero-copy against the copy path: GB/s and CPU seconds per GB, side by side in one run.

    .venv/bin/python -m bench.zero_copy --dir /tmp/zcbench [--objects 32] [--object-mib 32]

L1 is a POSIX shared-memory segment named the way ``lmcache server --shm-name`` names it, mapped
in this process, where the real plugin finds it. The same buffers go through the same gateway
twice per round: with ``zero_copy`` (the gateway moves the bytes between the disk and L1) and
with ``zero_copy: false`` (the plugin copies them through the session's window). Stores, then
loads into other L1 buffers (byte-exact, already touched once, as in a warm server), from the
disk with O_DIRECT, so never from the page cache. The gateway runs ``sync: none`` so the
pipeline, not fdatasync, is what is compared.
CPU is this process (the plugin: its copies) plus the gateway process (its checksums of L1, on the
zero-copy path).
Writes bench/results/zero_copy.json and zero_copy.md.
"""

from __future__ import annotations

import argparse
import resource
import select
import sys
import time
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import numpy as np

from adp_wire.ring.layout import align_up
from bench import gateways
from bench.plugin import connect, object_keys, wait_connected
from bench.results import write as write_result
from lmcache_adp import ADPConnector
from tests.support import Gateway, remove_tree

RESULTS = Path(__file__).parent / "results"
BATCH_KEYS = 4
BATCHES_IN_FLIGHT = 4
PATHS = {"zero-copy": True, "copy": False}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True, help="data directory (disk under test)")
    parser.add_argument("--objects", type=int, default=32)
    parser.add_argument("--object-mib", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--out", type=Path, default=RESULTS / "zero_copy", help="path without extension"
    )
    args = parser.parse_args()
    object_bytes = args.object_mib * 2**20
    remove_tree(args.dir)
    args.dir.mkdir(parents=True)
    config = gateways.write_config(args.dir / "gateway.yaml", {"sync": "none"})
    gateway = Gateway(
        args.dir,
        gateways.capacity_for(2 * args.rounds * args.objects, object_bytes),
        "--config",
        str(config),
    )
    segment = shared_memory.SharedMemory(
        name=f"lmcache_l1_pool_bench{time.monotonic_ns()}",
        create=True,
        size=2 * args.objects * align_up(object_bytes),
    )
    try:
        assert gateways.start(gateway) is None, gateway.log()[-2000:]
        assert segment.buf is not None
        rows = run(gateway, segment.buf, args.objects, object_bytes, args.rounds)
    finally:
        gateway.stop()
        segment.unlink()
        remove_tree(args.dir)
    report = {
        "command": " ".join(["python -m bench.zero_copy", *sys.argv[1:]]),
        "objects": args.objects,
        "object_bytes": object_bytes,
        "rounds": args.rounds,
        "sync": "none",
        "rows": rows,
        "summary": summarize(rows),
    }
    write_result(args.out, "zero_copy", report)
    print(markdown(report))
    return 0


def run(
    gateway: Gateway, memory: memoryview, objects: int, object_bytes: int, rounds: int
) -> list[dict[str, Any]]:
    stride = align_up(object_bytes)
    sources = [memory[i * stride : i * stride + object_bytes] for i in range(objects)]
    targets = [memory[(objects + i) * stride :][:object_bytes] for i in range(objects)]
    rng = np.random.default_rng(1)
    for buffer in sources:
        np.frombuffer(buffer, np.uint8)[:] = rng.integers(0, 256, object_bytes, dtype=np.uint8)
    for buffer in targets:  # L1 pages in use, as in a warm server (a page's first touch costs)
        np.frombuffer(buffer, np.uint8)[:] = 0
    rows = []
    for round_number in range(rounds):
        for path, zero_copy in PATHS.items():
            keys = object_keys(objects, first=(2 * round_number + zero_copy) * objects)
            connector = connect(gateway, zero_copy=zero_copy, op_timeout_s=120)
            wait_connected(connector)
            rows.append(measure(gateway, connector, "store", path, keys, sources))
            connector.close()
            assert rows[-1]["failed_batches"] == 0, f"stores failed: {rows[-1]}"
        for path, zero_copy in PATHS.items():
            keys = object_keys(objects, first=(2 * round_number + zero_copy) * objects)
            connector = connect(gateway, zero_copy=zero_copy, op_timeout_s=120)
            wait_connected(connector)
            for buffer in targets:
                buffer[:4096] = bytes(4096)
            rows.append(measure(gateway, connector, "load", path, keys, targets))
            connector.close()
            assert all(t == s for t, s in zip(targets, sources, strict=True)), "wrong bytes"
        for row in rows[-4:]:
            row["round"] = round_number
    return rows


def measure(
    gateway: Gateway,
    connector: ADPConnector,
    op: str,
    path: str,
    keys: list[str],
    buffers: list[memoryview],
) -> dict[str, Any]:
    submit = connector.submit_batch_set if op == "store" else connector.submit_batch_get
    cpu_plugin, cpu_gateway = _own_cpu_s(), gateways.cpu_seconds(gateway)
    started = time.monotonic()
    batches = [
        (keys[i : i + BATCH_KEYS], buffers[i : i + BATCH_KEYS])
        for i in range(0, len(keys), BATCH_KEYS)
    ]
    outstanding: set[int] = set()
    failed = 0
    while batches or outstanding:
        while batches and len(outstanding) < BATCHES_IN_FLIGHT:
            outstanding.add(submit(*batches.pop(0)))
        select.select([connector.event_fd()], [], [], 1.0)
        for future_id, ok, _, _ in connector.drain_completions():
            outstanding.discard(future_id)
            failed += not ok
    seconds = time.monotonic() - started
    gigabytes = len(keys) * buffers[0].nbytes / 1e9
    return {
        "op": op,
        "path": path,
        "failed_batches": failed,
        "seconds": round(seconds, 3),
        "gb_per_s": round(gigabytes / seconds, 3),
        "plugin_cpu_s_per_gb": round((_own_cpu_s() - cpu_plugin) / gigabytes, 3),
        "gateway_cpu_s_per_gb": round((gateways.cpu_seconds(gateway) - cpu_gateway) / gigabytes, 3),
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per op and path: the median of the rounds, and zero-copy's ratio to the copy path."""
    out: dict[str, Any] = {}
    for op in ("store", "load"):
        for path in PATHS:
            mine = [r for r in rows if r["op"] == op and r["path"] == path]
            out[f"{op} {path}"] = {
                key: float(np.median([r[key] for r in mine]))
                for key in ("gb_per_s", "plugin_cpu_s_per_gb", "gateway_cpu_s_per_gb")
            }
        zero, copy = out[f"{op} zero-copy"], out[f"{op} copy"]
        out[f"{op} ratio"] = {
            "gb_per_s": round(zero["gb_per_s"] / copy["gb_per_s"], 2),
            "total_cpu_s_per_gb": round(
                (zero["plugin_cpu_s_per_gb"] + zero["gateway_cpu_s_per_gb"])
                / (copy["plugin_cpu_s_per_gb"] + copy["gateway_cpu_s_per_gb"]),
                2,
            ),
        }
    return out


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"{report['objects']} objects of {report['object_bytes'] // 2**20} MiB per path and "
        f"round, {report['rounds']} rounds (medians), sync: {report['sync']}.",
        "",
        "| op | path | GB/s | plugin CPU s/GB | gateway CPU s/GB |",
        "|---|---|---|---|---|",
    ]
    summary = report["summary"]
    for op in ("store", "load"):
        for path in PATHS:
            row = summary[f"{op} {path}"]
            lines.append(
                f"| {op} | {path} | {row['gb_per_s']:.2f} | {row['plugin_cpu_s_per_gb']:.2f} | "
                f"{row['gateway_cpu_s_per_gb']:.2f} |"
            )
    for op in ("store", "load"):
        ratio = summary[f"{op} ratio"]
        lines.append(
            f"\n{op}: zero-copy / copy = {ratio['gb_per_s']}x the GB/s, "
            f"{ratio['total_cpu_s_per_gb']}x the CPU per GB (plugin + gateway)"
        )
    return "\n".join(lines) + "\n"


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    raise SystemExit(main())
