"""Store and load throughput through LMCache's own harness, lmcache-adp against fs_native, over a
matrix of shapes, against the disk's floor measured in the same run.

    python -m bench.matrix --dir /path/on/the/disk            # the full matrix (hours)
    python -m bench.matrix --dir /path/on/the/disk --quick    # 4 MiB only, minutes

Cells: object size (``--sizes-kb``) x keys per submit (``--keys``) x submits in flight
(``--in-flight``). Contenders (``--contenders``): lmcache-adp with each sync policy
(``adp-always``, ``adp-periodic``, ``adp-none``; every other setting its default) and LMCache's
``fs_native`` with ``use_odirect`` true and false (``fs-odirect``, ``fs-buffered``). An
experiment adds gateway settings to a contender: ``adp-periodic@io_threads=16;region_size=128MiB``;
``adp-periodic@databases_per_dir=2`` opens two databases in the data dir (the capacity split
between them), as a host with two drives would. ``--ram-l2 DIR`` adds ``lmcache-ram``: LMCache
alone, its ``fs_native`` buffered with its files in DIR (a tmpfs such as /dev/shm), the most any
adapter reaches through ``lmcache bench l2`` on this machine.

At the start, every directory a contender stores in (``--dir``, ``--ram-l2``) is checked for
O_DIRECT (bench/odirect.py) and its filesystem recorded: on one that refuses it the gateway and
``fs-odirect`` run buffered, and the report says so; the floor, O_DIRECT only, is then skipped.

A run of a contender on a cell starts from empty storage (a new data dir, database or fs_native
directory), stores through ``lmcache bench l2 --only store`` (bench/harness.py), drops the page
cache of its files (posix_fadvise DONTNEED; lmcache-adp's are O_DIRECT anyway), then loads from
a new process (``--only load``), and removes everything. Each cell runs every contender once per
repeat (``--repeats``, at least 3), the order rotated each repeat so no contender always goes
first; figures are medians over repeats. Each harness process moves at least ``--phase-mib``
(more measured rounds for small cells) after one warm-up round.

Beside every figure: CPU seconds per GB of the gateway and of the harness process (LMCache's
harness with the adapter in it: our plugin, or fs_native's C++ workers), over the harness's
rounds. The floor (bench/floor.py: fio and a Python probe at the gateway's shapes and at deep
ones, the faster tool of each) is measured before and after the cells; ratios use the better of
the two runs.

Cells whose round (size x keys x in flight) exceeds ``--round-mib-max`` are skipped and listed:
the harness holds a round's objects in memory (twice for fs_native's loads), and the machine is
shared. Writes bench/results/matrix.{json,md} (``--quick``: matrix-quick.*), MB/s = 10^6 bytes/s.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import shutil
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from adp_gateway.config import GatewayConfig
from bench import floor, gateways, odirect
from bench.harness import Load, drop_file_cache, lmcache_bench
from bench.machine import machine
from bench.matrix_report import RAM_L2, markdown
from bench.results import write as write_result
from tests.support import ROOT, Gateway, short_tmpdir

CONTENDERS = ("adp-always", "adp-periodic", "adp-none", "fs-odirect", "fs-buffered")
FULL = {
    "sizes_kb": "256,4096,32768",
    "keys": "8,32,128",
    "in_flight": "1,4",
    "contenders": ",".join(CONTENDERS),
    "repeats": 3,
    "phase_mib": 1024,
    "floor_gib": 4.0,
    "out": "bench/results/matrix",
}
QUICK = {
    "sizes_kb": "4096",
    "keys": "32",
    "in_flight": "1,4",
    "contenders": f"adp-{GatewayConfig().sync},fs-odirect",
    "repeats": 3,
    "phase_mib": 256,
    "floor_gib": 1.0,
    "out": "bench/results/matrix-quick",
}
HARNESS_ROUNDS_MAX = 256
SPACE_HEADROOM = 1.5  # free disk space needed, over the bytes a run stores


def run_adp(
    directory: Path, load: Load, policy: str, interval_ms: int, extra: dict[str, Any]
) -> dict[str, Any]:
    """lmcache-adp with ``sync: policy`` (and ``extra`` settings) on a new data dir: store,
    then load from a new process. Raises when the gateway does not start."""
    workdir, sockdir = directory / "adp", short_tmpdir()
    workdir.mkdir()
    settings = {**gateways.sync_settings(policy, interval_ms), **extra}
    config = gateways.write_config(workdir / "gateway.yaml", settings)
    capacity = adp_capacity(load, extra)
    gateway = Gateway(workdir, capacity, "--config", str(config), socket_path=sockdir / "gw.sock")
    try:
        error = gateways.start(gateway)
        if error is not None:
            raise RuntimeError(f"the gateway did not start: {error}")
        assert gateway.proc is not None
        spec = gateway.l2_adapter_json(op_timeout_s=60.0)
        pid = (gateway.proc.pid,)
        store = lmcache_bench(spec, "store", load, workdir / "store.json", pid)
        drop_file_cache(gateway.data_dir)
        loaded = lmcache_bench(spec, "load", load, workdir / "load.json", pid)
        dropped = gateways.dropped_sessions(gateway)
        if dropped["count"]:
            raise RuntimeError(f"the gateway dropped a session: {dropped['first']}")
        store["prepared_before"] = prepared_before(gateway.log(), store.pop("started_at"))
        loaded.pop("started_at")
        return {"store": _with_gateway_cpu(store), "load": _with_gateway_cpu(loaded)}
    finally:
        gateway.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(sockdir, ignore_errors=True)


def adp_capacity(load: Load, extra: dict[str, Any]) -> str:
    """The gateway's ``--capacity`` for a run of ``load``: every object, no eviction."""
    return f"{-(-gateway_bytes(load, extra) // 2**20)}MiB"


def gateway_bytes(load: Load, extra: dict[str, Any]) -> int:
    """Bytes the gateway preallocates for a run of ``load`` with settings ``extra``."""
    objects = (load.rounds + load.warmup_rounds) * load.keys * load.in_flight
    databases = gateways.databases_of(extra)
    return gateways.capacity_bytes_for(objects, load.size_kb * 1024, databases)


def prepared_before(gateway_log: str, started_at: float) -> float:
    """1.0 when the gateway had written its new database once (card/software/devices/preparer.py)
    before the stores' first round, else 0.0 (it prepares only while the disk is idle)."""
    for line in gateway_log.splitlines():
        if "are prepared" in line:
            stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            return float(stamp <= started_at)
    return 0.0


def _with_gateway_cpu(result: dict[str, Any]) -> dict[str, Any]:
    (gateway_cpu,) = result.pop("sampled_cpu_s_per_GB")
    return {**result, "gateway_cpu_s_per_GB": gateway_cpu}


def run_fs_native(
    directory: Path, load: Load, use_odirect: bool, files_in: Path | None = None
) -> dict[str, Any]:
    """LMCache's fs_native with its files in a new directory of ``files_in`` (else of
    ``directory``): store, drop its files' page cache (unless they are in ``files_in``, a
    tmpfs, where the page cache is where they live), load."""
    base = (files_in or directory) / f"fs_native-{os.getpid()}"
    reports = directory / "fs_native.out"
    base.mkdir()
    reports.mkdir()
    spec = json.dumps({"type": "fs_native", "base_path": str(base), "use_odirect": use_odirect})
    try:
        store = lmcache_bench(spec, "store", load, reports / "store.json")
        if files_in is None:
            drop_file_cache(base)
        loaded = lmcache_bench(spec, "load", load, reports / "load.json")
        for result in (store, loaded):
            del result["sampled_cpu_s_per_GB"], result["started_at"]
        return {"store": store, "load": loaded}
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(reports, ignore_errors=True)


def contender_runner(
    name: str, interval_ms: int, ram_dir: Path | None = None
) -> Callable[[Path, Load], dict[str, Any]]:
    """``adp-POLICY``, optionally ``@key=value;key=value`` gateway settings (an experiment:
    ``adp-periodic@io_threads=16``), ``fs-odirect``, ``fs-buffered``, or ``lmcache-ram``
    (fs_native buffered in ``ram_dir``)."""
    if name.startswith("adp-"):
        policy, extra = gateways.contender_settings(name.removeprefix("adp-"))
        return lambda directory, load: run_adp(directory, load, policy, interval_ms, extra)
    if name in ("fs-odirect", "fs-buffered"):
        use_odirect = name == "fs-odirect"
        return lambda directory, load: run_fs_native(directory, load, use_odirect)
    if name == RAM_L2:
        if ram_dir is None:
            raise ValueError(f"{RAM_L2} stores in --ram-l2 DIR: name a tmpfs directory")
        return lambda directory, load: run_fs_native(directory, load, False, ram_dir)
    known = ", ".join((*CONTENDERS, RAM_L2))
    raise ValueError(f"unknown contender {name!r}; choose from {known}")


def harness_load(size_kb: int, keys: int, in_flight: int, phase_bytes: int) -> Load:
    """The shape, with enough measured rounds that a phase moves at least ``phase_bytes``."""
    round_bytes = size_kb * 1024 * keys * in_flight
    rounds = min(HARNESS_ROUNDS_MAX, max(1, -(-phase_bytes // round_bytes)))
    return Load(size_kb, keys, in_flight, rounds)


def run_cell(
    directory: Path,
    load: Load,
    contenders: list[str],
    repeats: int,
    interval_ms: int,
    ram_dir: Path | None = None,
) -> dict[str, Any]:
    """Every contender ``repeats`` times, in an order rotated each repeat; medians."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in contenders}
    failures: dict[str, str] = {}
    for repeat in range(repeats):
        order = contenders[repeat % len(contenders) :] + contenders[: repeat % len(contenders)]
        for name in order:
            if name in failures:
                continue
            try:
                runs[name].append(contender_runner(name, interval_ms, ram_dir)(directory, load))
            except Exception as exc:
                traceback.print_exc()
                failures[name] = f"{type(exc).__name__}: {exc}"[-2000:]
    cell: dict[str, Any] = {"load": load.__dict__, "runs": runs, "medians": {}}
    for name, results in runs.items():
        if results:
            cell["medians"][name] = _medians(results)
    if failures:
        cell["failed"] = "; ".join(f"{n}: {why.splitlines()[-1]}" for n, why in failures.items())
        cell["failures"] = failures
    return cell


def _medians(results: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for op in ("store", "load"):
        values = [r[op] for r in results]
        out[op] = {
            key: statistics.median(v[key] for v in values)
            for key in values[0]
            if isinstance(values[0][key], int | float)
        }
        out[op]["samples"] = len(values)
    return out


def skip_reason(
    load: Load,
    directory: Path,
    round_bytes_max: int,
    contenders: list[str] | None = None,
    ram_dir: Path | None = None,
) -> str | None:
    """Why the cell cannot run, or None: a round too large, or too little free space for the
    bytes stored (or a gateway's preallocated capacity) in ``directory`` and in ``ram_dir``."""
    if load.round_bytes > round_bytes_max:
        return f"a round of {load.round_bytes / 2**30:.1f} GiB is over --round-mib-max"
    stored = (load.rounds + load.warmup_rounds) * load.round_bytes
    capacities = [
        gateway_bytes(load, gateways.contender_settings(name)[1])
        for name in contenders or []
        if name.startswith("adp-")
    ]
    needs = [(directory, max([stored * SPACE_HEADROOM, *capacities]))]
    if ram_dir is not None and RAM_L2 in (contenders or []):
        needs.append((ram_dir, stored * SPACE_HEADROOM))
    for where, needed in needs:
        free = shutil.disk_usage(where).free
        if needed > free:
            return f"needs {needed / 2**30:.1f} GiB free in {where}, {free / 2**30:.1f} left"
    return None


def run(args: argparse.Namespace) -> dict[str, Any]:
    # The gateway (a console script) and the harness import this checkout, as the bench does.
    os.environ["PYTHONPATH"] = str(ROOT)
    directory: Path = args.dir
    ram_dir: Path | None = args.ram_l2
    sizes = [int(s) for s in args.sizes_kb.split(",")]
    contenders = args.contenders.split(",")
    for name in contenders:  # unknown names fail before hours of work
        contender_runner(name, args.sync_interval_ms, ram_dir)
    checks = check_dirs([directory] if ram_dir is None else [directory, ram_dir])
    report: dict[str, Any] = {
        "command": " ".join(["python -m bench.matrix", *args.argv]),
        "started": time.strftime("%Y-%m-%d %H:%M:%S +0000", time.gmtime()),
        "machine": machine(directory),
        "defaults": {"sync": GatewayConfig().sync},
        "settings": {k: str(v) for k, v in vars(args).items() if k != "argv"},
        "odirect": checks,
        "cells": [],
        "skipped": [],
    }
    floor_bytes = int(args.floor_gib * 2**30)
    floor_sizes = [s * 1024 for s in sizes]
    measure_floor = odirect.works(checks, directory)
    if measure_floor:
        report["floor_before"] = floor.floors(directory / "floor", floor_sizes, floor_bytes)
    for size_kb, keys, in_flight in itertools.product(
        sizes, [int(k) for k in args.keys.split(",")], [int(n) for n in args.in_flight.split(",")]
    ):
        load = harness_load(size_kb, keys, in_flight, args.phase_mib * 2**20)
        why = skip_reason(load, directory, args.round_mib_max * 2**20, contenders, ram_dir)
        if why is not None:
            report["skipped"].append({"load": load.__dict__, "why": why})
            continue
        started = time.perf_counter()
        cell = run_cell(directory, load, contenders, args.repeats, args.sync_interval_ms, ram_dir)
        cell["seconds"] = round(time.perf_counter() - started, 1)
        cell["loadavg"] = _loadavg()
        report["cells"].append(cell)
        print(json.dumps({"load": load.__dict__, "medians": cell["medians"]}), flush=True)
        yield_report(report, args)
    if measure_floor:
        report["floor_after"] = floor.floors(directory / "floor", floor_sizes, floor_bytes)
    report["machine"]["loadavg_end"] = _loadavg()
    return report


def check_dirs(directories: list[Path]) -> list[dict[str, Any]]:
    """Each directory's O_DIRECT check (bench/odirect.py), created first if need be; printed."""
    checks = []
    for directory in directories:
        directory.mkdir(parents=True, exist_ok=True)
        checks.append(odirect.check(directory))
        print(odirect.line(checks[-1]), flush=True)
    return checks


def yield_report(report: dict[str, Any], args: argparse.Namespace) -> None:
    """Write what there is so far, so an interrupted run keeps its cells."""
    write_result(Path(args.out), "matrix", report)


def _loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True, help="on the disk under test")
    parser.add_argument("--quick", action="store_true", help="4 MiB objects, two contenders")
    parser.add_argument("--sizes-kb")
    parser.add_argument("--keys", help="keys per submit (--num-keys)")
    parser.add_argument("--in-flight", help="submits in flight (--in-flight)")
    parser.add_argument("--contenders", help=f"of {', '.join(CONTENDERS)}, {RAM_L2}")
    parser.add_argument(
        "--ram-l2",
        type=Path,
        help=f"adds {RAM_L2}: LMCache's fs_native, buffered, with its files here (a tmpfs)",
    )
    parser.add_argument("--repeats", type=int, help="runs of each contender per cell (medians)")
    parser.add_argument("--phase-mib", type=int, help="least a harness process moves")
    parser.add_argument("--floor-gib", type=float, help="the file the floor moves")
    parser.add_argument("--round-mib-max", type=int, default=4096)
    parser.add_argument("--sync-interval-ms", type=int, default=GatewayConfig().sync_interval_ms)
    parser.add_argument("--out", help="path without extension for .json and .md")
    args = parser.parse_args(argv)
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.repeats < 3:
        parser.error("--repeats: medians need at least 3")
    names = args.contenders.split(",")
    if args.ram_l2 is not None and RAM_L2 not in names:
        args.contenders = ",".join([*names, RAM_L2])
    if args.ram_l2 is None and RAM_L2 in names:
        parser.error(f"--contenders {RAM_L2}: name its directory with --ram-l2 DIR (a tmpfs)")
    args.argv = argv
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    report = run(args)
    yield_report(report, args)
    print(markdown(report))
    print(f"wrote {args.out}.json and {args.out}.md")
    return 1 if any("failed" in cell for cell in report["cells"]) else 0


if __name__ == "__main__":
    sys.exit(main())
