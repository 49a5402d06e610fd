"""Where a batch's time goes, stage by stage, on the product's own code (adp_wire/trace.py).

A client drives the plugin as LMCache does (submit a batch of ``--keys`` objects, wait on the
event fd), one batch in flight, against a real gateway: first it stores ``--phase-mib`` of
objects, then it loads them back in the same batches. The plugin and the gateway stamp each
stage (``ADP_TRACE``); since one batch is in flight at a time, every stamp between a batch's
submit and its report belongs to it. For each size and op the table gives the median time from
the submit to each stage, and what the device calls took: how many a batch made, their median
length, and how long the device was busy for the batch (the union of its calls).

    python -m bench.op_path --dir /tmp/op --sizes-kb 256,4096,32768 --keys 8 \
        --out bench/results/op-path

Beside each cell, the CPU seconds per GB of each role of the plugin (this process: the link's
thread ``adp-io``, the copy threads ``adp-copy``) and of the gateway (its I/O threads ``io``, the
session's thread, ...), from their threads' own counters (bench/thread_cpu.py): what sizes a host
for a drive (docs/operations.md, "Sizing"). Stores take the path LMCache's private L1 takes:
the gateway copies them out of this process itself where the kernel lets it (remote copy), else
the plugin copies them (``--copy-path`` forces that).

The disk's floor (bench/floor.py: fio, or dd, and a Python probe at the gateway's own shapes and
at the disk's best) runs first, in the same invocation, and each cell's MB/s stands beside it.
Huge pages matter to the device calls (docs/operations.md, "Huge pages"): the table records the
host's shmem setting.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from adp_gateway.host import hugepages
from adp_wire import trace
from adp_wire.trace import Stage, Stamp
from bench import floor as disk_floor
from bench import gateways, thread_cpu
from bench.machine import machine
from bench.plugin import connect, object_keys, wait_connected
from bench.results import write as write_result
from tests.support import Gateway, wait_for_future

# What the table shows for each batch: ms from its submit to the first or last stamp of a stage.
MILESTONES: list[tuple[str, Stage, Callable[[list[int]], int]]] = [
    ("plugin: last request on the ring", Stage.SEND, max),
    ("gateway: took the doorbell", Stage.DISPATCH, min),
    ("gateway: first task starts", Stage.TASK, min),
    ("gateway: last task starts", Stage.TASK, max),
    ("device: first call starts", Stage.DEVICE_START, min),
    ("device: last call ends", Stage.DEVICE_END, max),
    ("gateway: last completion posted", Stage.COMPLETE, max),
    ("plugin: last completion taken", Stage.COMPLETION, max),
    ("plugin: last copy done", Stage.COPIED, max),
    ("plugin: batch reported", Stage.REPORT, max),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, required=True, help="on the disk under test")
    parser.add_argument("--sizes-kb", default="256,4096,32768")
    parser.add_argument("--keys", type=int, default=8, help="objects per batch")
    parser.add_argument("--phase-mib", type=int, default=1024, help="bytes each phase moves")
    parser.add_argument("--batches-max", type=int, default=200)
    parser.add_argument("--floor-gib", type=float, default=1.0, help="the file the floor moves")
    parser.add_argument("--out", type=Path, default=Path("bench/results/op-path"))
    parser.add_argument(
        "--copy-path", action="store_true", help="the plugin copies stores (no remote copy)"
    )
    args = parser.parse_args(argv)

    results: dict[str, Any] = {
        "command": "python -m bench.op_path " + " ".join(argv or sys.argv[1:]),
        "machine": machine(args.dir),
        "shmem_huge_pages": hugepages.shmem_setting(),
        "keys": args.keys,
        "copy_path": args.copy_path,
        "cells": [],
    }
    sizes = [int(s) * 1024 for s in args.sizes_kb.split(",")]
    results["floor"] = disk_floor.floors(args.dir / "floor", sizes, int(args.floor_gib * 2**30))
    for size_kb in (size // 1024 for size in sizes):
        batches = max(3, min(args.batches_max, args.phase_mib * 1024 // (size_kb * args.keys)))
        cells = run_size(args.dir, size_kb * 1024, args.keys, batches, not args.copy_path)
        results["cells"].extend(cells)
    write_result(args.out, "op_path", results)
    print(f"wrote {args.out}.json and {args.out}.md")
    return 0


def run_size(
    root: Path, object_bytes: int, keys: int, batches: int, remote_copy: bool
) -> list[dict[str, Any]]:
    """Store then load ``batches`` batches of ``keys`` objects; one cell per op."""
    work = root / f"{object_bytes // 1024}k"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    prefix = work / "trace"
    os.environ[trace.ENV] = str(prefix)  # the gateway's
    trace.enable(str(prefix))
    gateway = Gateway(work, gateways.capacity_for(2 * keys * batches, object_bytes))
    try:
        gateways.start(gateway)
        connector = connect(gateway, op_timeout_s=60.0, remote_copy=remote_copy)
        try:
            wait_connected(connector)
            names = object_keys(keys * batches)
            rows = np.random.default_rng(0).integers(0, 256, (keys, object_bytes), dtype=np.uint8)
            buffers = [memoryview(row) for row in rows]
            trace.taken()
            assert gateway.proc is not None
            processes = {"plugin": os.getpid(), "gateway": gateway.proc.pid}
            cpu = [{name: thread_cpu.by_role(pid) for name, pid in processes.items()}]
            stores = run_batches(connector, "set", names, buffers, keys)
            cpu.append({name: thread_cpu.by_role(pid) for name, pid in processes.items()})
            loads = run_batches(connector, "get", names, buffers, keys)
            cpu.append({name: thread_cpu.by_role(pid) for name, pid in processes.items()})
            plugin = trace.taken()
        finally:
            connector.close()
    finally:
        gateway.stop()
        del os.environ[trace.ENV]
    stamps = sorted(plugin + [s for f in work.glob("trace.*") for s in trace.read(f)])
    shutil.rmtree(work, ignore_errors=True)  # on tmpfs the database holds that much RAM
    moved = len(names) * object_bytes
    cells = [
        cell("store", object_bytes, keys, stores, stamps),
        cell("load", object_bytes, keys, loads, stamps),
    ]
    for phase, one in enumerate(cells):
        one["cpu_s_per_GB"] = {
            name: thread_cpu.per_gb(cpu[phase][name], cpu[phase + 1][name], moved)
            for name in cpu[0]
        }
    return cells


def run_batches(
    connector: Any, op: str, names: list[str], buffers: list[memoryview], keys: int
) -> list[tuple[int, int, int]]:
    """Each batch in turn, waited for: (future id, start ns, end ns) of each."""
    submit = connector.submit_batch_set if op == "set" else connector.submit_batch_get
    spans = []
    for first in range(0, len(names), keys):
        started = time.monotonic_ns()
        future_id = submit(names[first : first + keys], buffers)
        done = wait_for_future(connector, future_id, 120)
        if not done[1] or not all(done[3] or []):
            raise RuntimeError(f"{op} of batch {first // keys} failed: {done[2]}")
        spans.append((future_id, started, time.monotonic_ns()))
    return spans


def cell(
    op: str,
    object_bytes: int,
    keys: int,
    spans: list[tuple[int, int, int]],
    stamps: list[Stamp],
) -> dict[str, Any]:
    """Medians over the batches (the first tenth left out: the window's first touch)."""
    per_batch = [batch_stages(stamps, future_id, start, end) for future_id, start, end in spans]
    kept = per_batch[len(per_batch) // 10 :]
    medians = {name: statistics.median(b[name] for b in kept) for name in kept[0]}
    return {
        "op": op,
        "object_kib": object_bytes // 1024,
        "keys": keys,
        "batches": len(kept),
        "mb_per_s": keys * object_bytes / 1e3 / medians["client: batch done"],
        "ms": medians,
    }


def batch_stages(stamps: list[Stamp], future_id: int, start: int, end: int) -> dict[str, float]:
    inside = [s for s in stamps if start <= s[0] <= end]
    submitted = next(
        ns for ns, stage, ident, _ in inside if stage == Stage.SUBMIT and ident == future_id
    )
    stages: dict[str, float] = {}
    for name, stage, pick in MILESTONES:
        times = [ns for ns, s, _, _ in inside if s == stage]
        stages[name] = (pick(times) - submitted) / 1e6 if times else float("nan")
    calls = device_calls(inside)
    stages["device: calls"] = len(calls)
    stages["device: one call, median"] = (
        statistics.median(e - s for s, e in calls) / 1e6 if calls else float("nan")
    )
    stages["device: busy (union of calls)"] = union_ns(calls) / 1e6
    stages["client: batch done"] = (end - submitted) / 1e6
    return stages


def device_calls(stamps: list[Stamp]) -> list[tuple[int, int]]:
    """(start, end) of each device call, paired on its thread."""
    open_calls: dict[int, int] = {}
    calls = []
    for ns, stage, _, thread in stamps:
        if stage == Stage.DEVICE_START:
            open_calls[thread] = ns
        elif stage == Stage.DEVICE_END and thread in open_calls:
            calls.append((open_calls.pop(thread), ns))
    return calls


def union_ns(spans: list[tuple[int, int]]) -> int:
    total, reach = 0, 0
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def cpu_table(cells: list[dict[str, Any]]) -> list[str]:
    """One row per process and role; the GB/s one core of that role moves is 1 / the figure."""
    header = [f"{c['object_kib']} KiB {c['op']}" for c in cells]
    lines = ["| process: role | " + " | ".join(header) + " |", "|---|" + "---|" * len(cells)]
    for process in ("plugin", "gateway"):
        roles = sorted({r for c in cells for r in c["cpu_s_per_GB"][process]})
        for name in roles:
            shown = [f"{c['cpu_s_per_GB'][process].get(name, 0.0):.3f}" for c in cells]
            lines.append(f"| {process}: {name} | " + " | ".join(shown) + " |")
        totals = [f"{sum(c['cpu_s_per_GB'][process].values()):.3f}" for c in cells]
        lines.append(f"| **{process}: all** | " + " | ".join(totals) + " |")
    return lines


def report(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        f"{m['cpus']} CPUs, load average "
        f"{m['loadavg_start'][0]:.1f} at start, `{m['dir_filesystem']}`, shmem huge pages: "
        f"`{results['shmem_huge_pages']}`. One batch of {results['keys']} objects in flight; "
        "milliseconds from LMCache's submit, medians over the batches.",
        "",
    ]
    cells = results["cells"]
    header = [f"{c['object_kib']} KiB {c['op']}" for c in cells]
    lines += ["| stage | " + " | ".join(header) + " |", "|---|" + "---|" * len(cells)]
    for name in cells[0]["ms"]:
        values = [c["ms"][name] for c in cells]
        shown = [f"{v:.0f}" if name == "device: calls" else f"{v:.2f}" for v in values]
        lines.append(f"| {name} | " + " | ".join(shown) + " |")
    shown = [f"{c['mb_per_s']:.0f}" for c in cells]
    lines.append("| MB/s (batch bytes / median batch time) | " + " | ".join(shown) + " |")
    floor = results.get("floor")  # runs before the floor was part of this bench have none
    for label, figure in (
        ("floor at the gateway's shape", "gateway_shape"),
        ("floor's best", "best"),
    ):
        if floor is None:
            break
        shown = []
        for c in cells:
            direction = "write" if c["op"] == "store" else "read"
            figures = disk_floor.for_size(floor, c["object_kib"] * 1024)
            rate = figures[f"{figure}_{direction}_GBps"] * 1e3
            shown.append(f"{rate:.0f} ({c['mb_per_s'] / rate:.2f}x)")
        lines.append(f"| {label}, MB/s (ours / it) | " + " | ".join(shown) + " |")
    if all("cpu_s_per_GB" in c for c in cells):  # runs before thread_cpu.py have none
        lines += ["", "## CPU seconds per GB, by thread role (bench/thread_cpu.py)", ""]
        lines += cpu_table(cells)
    if floor is not None:
        lines += ["", "## The disk's floor, same run (bench/floor.py)", "", disk_floor.table(floor)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
