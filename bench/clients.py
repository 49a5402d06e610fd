"""Aggregate throughput of many clients on one gateway, against the disk's own O_DIRECT limit.

    python -m bench.clients --dir /path/on/the/disk [--clients 1,2,4,8] [--object-mib 32] \\
        [--total-gib 4] [--in-flight 4]

For each client count N, a fresh gateway (default config: ``sync: always``) on a fresh database
under ``--dir``; N client processes (bench/clients_worker.py, each its own ADPConnector, the real
plugin, as an MP server has) store ``--total-gib`` between them, ``--in-flight`` objects each
outstanding, all starting together. The gateway is then restarted and N new processes load every
object back and compare it byte for byte. Every point moves the same bytes. Aggregate GB/s is all
bytes over the time from the first client's start to the last one's end. The disk's floor
(bench/floor.py: fio and a Python probe) moves the same bytes with the gateway's I/O size and
depth, in the same run. Gateway CPU seconds per GB are read from /proc around each phase.
Writes ``bench/results/clients.json`` and ``bench/results/clients.md`` (GB/s = 10^9 bytes/s).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import floor, gateways
from bench.machine import machine
from bench.results import write as write_result
from tests.support import ROOT, Gateway, short_tmpdir

RESULTS = ROOT / "bench" / "results"
PHASE_TIMEOUT_S = 900


def run_phase(
    gateway: Gateway, op: str, clients: int, objects: int, object_bytes: int, depth: int
) -> dict[str, Any]:
    """N workers do ``op`` on their objects at once; aggregate and per-client GB/s, failures."""
    workers = [_spawn(gateway, op, c, objects, object_bytes, depth) for c in range(clients)]
    try:
        for worker in workers:
            _expect(worker, "ready")
        cpu_before = gateways.cpu_seconds(gateway)
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        reports = [json.loads(_expect(worker, "{")) for worker in workers]
        cpu_seconds = gateways.cpu_seconds(gateway) - cpu_before
    finally:
        for worker in workers:
            worker.kill()
            worker.wait(30)
    total_gb = clients * objects * object_bytes / 1e9
    seconds = max(r["ended"] for r in reports) - min(r["started"] for r in reports)
    return {
        "GBps": total_gb / seconds,
        "seconds": seconds,
        "per_client_GBps": [
            objects * object_bytes / 1e9 / (r["ended"] - r["started"]) for r in reports
        ],
        "failed_objects": sum(r["failed"] for r in reports),
        "differing_objects": sum(r["differ"] for r in reports),
        "gateway_cpu_s_per_GB": cpu_seconds / total_gb,
    }


def _spawn(
    gateway: Gateway, op: str, client: int, objects: int, object_bytes: int, depth: int
) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "bench.clients_worker", "--socket", str(gateway.socket_path)]
    argv += ["--op", op, "--client", str(client), "--objects", str(objects)]
    argv += ["--object-bytes", str(object_bytes), "--in-flight", str(depth)]
    return subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT
    )


def _expect(worker: subprocess.Popen[str], start: str) -> str:
    """The worker's next line, which must begin with ``start``."""
    assert worker.stdout is not None
    line = worker.stdout.readline()
    if not line.startswith(start):
        worker.wait(PHASE_TIMEOUT_S)
        raise RuntimeError(f"client exited {worker.returncode} instead of {start!r}: {line!r}")
    return line


def run_point(directory: Path, clients: int, args: argparse.Namespace) -> dict[str, Any]:
    """Store with N clients, restart the gateway, load with N new ones."""
    object_bytes = args.object_mib * 2**20
    total_objects = args.total_gib * 2**30 // object_bytes
    objects = total_objects // clients
    workdir, sockdir = directory / f"clients{clients}", short_tmpdir()
    workdir.mkdir()
    capacity = gateways.capacity_for(total_objects, object_bytes)
    gateway = Gateway(workdir, capacity, socket_path=sockdir / "gw.sock")
    point: dict[str, Any] = {"clients": clients, "objects_per_client": objects}
    try:
        for phase in ("store", "load"):
            error = gateways.start(gateway)
            if error is not None:
                raise RuntimeError(f"the gateway did not start: {error}")
            point[phase] = run_phase(gateway, phase, clients, objects, object_bytes, args.in_flight)
            gateway.stop()
        point["sessions_dropped"] = gateways.dropped_sessions(gateway)
        return point
    finally:
        gateway.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(sockdir, ignore_errors=True)


def disk_limit(directory: Path, total_bytes: int, object_bytes: int) -> dict[str, float]:
    """The floor (bench/floor.py) at the gateway's I/O size and depth for such objects."""
    shapes = floor.gateway_shapes(object_bytes)
    return floor.limit(directory / "floor", total_bytes, shapes["write"], shapes["read"])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    object_bytes = args.object_mib * 2**20
    report: dict[str, Any] = {
        "command": "python -m bench.clients "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine(args.dir),
        "object_bytes": object_bytes,
        "bytes_per_point": args.total_gib * 2**30 // object_bytes * object_bytes,
        "in_flight_per_client": args.in_flight,
        "disk_before": disk_limit(args.dir, args.total_gib * 2**30, object_bytes),
        "points": [run_point(args.dir, n, args) for n in args.clients],
    }
    report["disk_after"] = disk_limit(args.dir, args.total_gib * 2**30, object_bytes)
    report["disk"] = {  # the limit: the better of the two probes, as the disk is noisy
        op: max(report["disk_before"][op], report["disk_after"][op])
        for op in ("write_GBps", "read_GBps")
    }
    report["machine"]["loadavg_end"] = os.getloadavg()
    write_result(args.out, "clients", report)
    print(markdown(report))
    bad = [p for p in report["points"] for op in ("store", "load") if _errors(p[op])]
    return 1 if bad else 0


def _errors(phase: dict[str, Any]) -> int:
    return int(phase["failed_objects"] + phase["differing_objects"])


def markdown(report: dict[str, Any]) -> str:
    disk, points = report["disk"], report["points"]
    probe, after = report["disk_before"], report["disk_after"]
    base = points[0]
    rows = [
        "| clients | store GB/s | load GB/s | store / disk | load / disk | store x 1 client "
        "| load x 1 client | gateway CPU s/GB store | load | failed or differing objects |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        store, load = p["store"], p["load"]
        rows.append(
            f"| {p['clients']} | {store['GBps']:.3f} | {load['GBps']:.3f} "
            f"| {store['GBps'] / disk['write_GBps']:.2f} | {load['GBps'] / disk['read_GBps']:.2f} "
            f"| {store['GBps'] / base['store']['GBps']:.2f} "
            f"| {load['GBps'] / base['load']['GBps']:.2f} "
            f"| {store['gateway_cpu_s_per_GB']:.2f} | {load['gateway_cpu_s_per_GB']:.2f} "
            f"| {_errors(store) + _errors(load)} |"
        )
    info = report["machine"]
    return (
        "\n".join(
            [
                f"{info['cpus']} CPUs, load average {info['loadavg_start'][0]:.2f} at start, "
                f"`{info['dir_filesystem']}`. Objects of {report['object_bytes'] // 2**20} MiB, "
                f"{report['bytes_per_point'] / 1e9:.2f} GB stored and loaded per point, "
                f"{report['in_flight_per_client']} in flight per client. GB/s = 10^9 bytes/s.",
                "",
                f"Disk O_DIRECT limit (bench/floor.py, {probe['io_bytes'] // 2**20} MiB I/Os, "
                f"{probe['threads']} threads, before / after the points; ratios use the better): "
                f"write {probe['write_GBps']:.3f} / {after['write_GBps']:.3f} GB/s, "
                f"read {probe['read_GBps']:.3f} / {after['read_GBps']:.3f} GB/s.",
                "",
                *rows,
            ]
        )
        + "\n"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.clients", description=__doc__)
    parser.add_argument("--dir", type=Path, required=True, help="on the disk under test")
    parser.add_argument(
        "--clients", type=lambda text: [int(n) for n in text.split(",")], default=[1, 2, 4, 8]
    )
    parser.add_argument("--object-mib", type=int, default=32)
    parser.add_argument("--total-gib", type=int, default=4, help="bytes of every point")
    parser.add_argument("--in-flight", type=int, default=4, help="objects outstanding per client")
    parser.add_argument(
        "--out",
        type=Path,
        default=RESULTS / "clients",
        help="path without extension of the results",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
