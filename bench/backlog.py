"""Read-first scheduling under a store backlog: load latency, admission control, fairness.

    .venv/bin/python -m bench.backlog --dir /path/on/the/disk [--loads 10] [--flooders 3]

Every client is a real ``ADPConnector``; every flood runs in its own process
(bench/backlog_flood.py), and the gateway is ``adp-gateway serve`` that also logs its
scheduler's queues (bench/backlog_gateway.py), which is how the queue depth is measured. Four
phases, each on a fresh gateway on ``--dir``:

- ``backlog``: the latency of loading one object of ``--object-mib`` (byte-exact) on an idle
  gateway, then while ``--flooders`` processes keep stores queued in it (windows and
  ``store_backlog_max`` raised so that several GB can queue); the ratio (target: at most 2x).
- ``fairness``: one process floods stores; a second session alternates loads and stores. For
  each of its stores: how many of the flood's stores completed while it waited.
- ``admission``: the default ``store_backlog_max``; flooders offer more than the disk takes.
  How many stores are refused, and how long from submit to the failed completion.
- ``pending``: the default gateway and plugin settings, one client with more stores out than its
  transfer window holds: how long LMCache's buffers are held (submit to completion), and where
  the stores wait (the gateway's queue or the plugin's own pending queue).
- ``one_session``: as LMCache really uses the plugin, one session carries both: the measuring
  session itself keeps a multi-GB store backlog out (each completed store replaced at once) and
  times its own loads behind it, against the same loads idle (target: p50 at most 1.5x).

Writes bench/results/backlog.json and backlog.md (``--out`` changes the stem).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from adp_gateway.config import GatewayConfig
from bench import backlog_gateway, backlog_report, gateways, plugin
from bench.machine import machine
from bench.results import write as write_result
from tests.support import Gateway, Process, wait_for_future, wait_until

GiB = 2**30
MiB = 2**20
LOAD_PAUSE_S = 0.3  # between two timed loads, so they sample the queue at different depths


class SampledGateway(Gateway):
    """A gateway process that logs its scheduler's queues (bench/backlog_gateway.py)."""

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "bench.backlog_gateway", "serve", *self.args]

    def samples(self) -> list[tuple[float, int, int]]:
        return backlog_gateway.samples(self.log())

    def backlog_bytes(self) -> int:
        found = self.samples()
        return found[-1][2] if found else 0


class Flooder(Process):
    """One bench/backlog_flood.py process."""

    def __init__(self, workdir: Path, name: str) -> None:
        super().__init__(name, workdir / f"{name}.log")
        self.out = workdir / f"{name}.json"

    def start(self, gateway: Gateway, *flags: str) -> None:
        argv = [sys.executable, "-m", "bench.backlog_flood", "--socket", str(gateway.socket_path)]
        argv += ["--name", self.name, "--out", str(self.out), *flags]
        self.spawn(argv, stdin=subprocess.PIPE)
        wait_until(lambda: "flooding" in self.log() or not self.alive, 60, f"{self.name} up")
        assert self.alive, self.log()

    def finish(self) -> list[list[Any]]:
        """Stop submitting, wait for the stores out to complete; the records of every store."""
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.close()
        code = self.proc.wait(300)
        assert code == 0, self.log()[-3000:]
        return list(json.loads(self.out.read_text()))


class Prober:
    """The measuring session: stores and loads objects through its own ADPConnector."""

    def __init__(self, gateway: Gateway, object_bytes: int) -> None:
        self.connector = plugin.connect(gateway, op_timeout_s=120.0)
        plugin.wait_connected(self.connector)
        self.object_bytes = object_bytes
        self._into = memoryview(bytearray(object_bytes))

    def store(self, key: str, data: memoryview) -> tuple[float, float, bool]:
        """(submitted, completed, ok), times from time.monotonic."""
        started = time.monotonic()
        item = wait_for_future(self.connector, self.connector.submit_batch_set([key], [data]), 300)
        return started, time.monotonic(), bool(item[1])

    def load(self, key: str, expected: memoryview) -> tuple[float, float]:
        """(submitted, seconds) of one load, which must hit byte-exact."""
        started = time.monotonic()
        future_id = self.connector.submit_batch_get([key], [self._into])
        item = wait_for_future(self.connector, future_id, 300)
        took = time.monotonic() - started
        if item[3] != [True] or self._into != expected:
            raise RuntimeError(f"load of {key} did not return its bytes: {item}")
        return started, took

    def loads_behind_own_stores(
        self, key: str, expected: memoryview, depth_bytes: int, loads: int, gateway: SampledGateway
    ) -> tuple[list[tuple[float, float]], list[tuple[float, float, bool]]]:
        """Keep ``depth_bytes`` of stores out on this same session (each completed one replaced
        at once), and once the gateway holds most of them, time ``loads`` loads of ``key``
        behind them, one after another: ((submitted, seconds) per load, store records)."""
        connector, object_bytes = self.connector, self.object_bytes
        stores: dict[int, float] = {}  # future id -> submitted
        records: list[tuple[float, float, bool]] = []
        serial = iter(range(10**9))

        def store() -> None:
            future_id = connector.submit_batch_set(
                [f"{plugin.MODEL}@own@0@{next(serial):064x}"], [expected]
            )
            stores[future_id] = time.monotonic()

        for _ in range(depth_bytes // object_bytes):
            store()
        busy: list[tuple[float, float]] = []
        load: tuple[int, float] | None = None
        paused_until = 0.0
        deadline = time.monotonic() + 600
        while len(busy) < loads and time.monotonic() < deadline:
            now = time.monotonic()
            if load is None and now >= paused_until and gateway.backlog_bytes() >= depth_bytes // 2:
                started = time.monotonic()  # after reading the gateway's log, not before
                load = connector.submit_batch_get([key], [self._into]), started
            select.select([connector.event_fd()], [], [], LOAD_PAUSE_S)
            for future_id, ok, _, per_key in connector.drain_completions():
                if future_id in stores:
                    records.append((stores.pop(future_id), time.monotonic(), bool(ok)))
                    store()
                elif load is not None and future_id == load[0]:
                    took = time.monotonic() - load[1]  # before checking its 32 MiB, as idle
                    if per_key != [True] or self._into != expected:
                        raise RuntimeError(f"a load behind the backlog failed: {per_key}")
                    busy.append((load[1], took))
                    load, paused_until = None, time.monotonic() + LOAD_PAUSE_S
        while stores and time.monotonic() < deadline + 300:  # the backlog drains, unrecorded
            select.select([connector.event_fd()], [], [], 1.0)
            for future_id, *_ in connector.drain_completions():
                stores.pop(future_id, None)
        return busy, records

    def close(self) -> None:
        self.connector.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True, help="on the disk under test")
    parser.add_argument("--object-mib", type=int, default=32)
    parser.add_argument("--loads", type=int, default=10, help="timed loads per measurement")
    parser.add_argument("--flooders", type=int, default=3, help="flood processes (backlog)")
    parser.add_argument("--window-mib", type=int, default=1536, help="session window (backlog)")
    parser.add_argument("--depth-gib", type=float, default=3.0, help="backlog to reach first")
    parser.add_argument("--capacity", default="8GiB", help="each phase's gateway")
    parser.add_argument("--admission-s", type=float, default=15.0)
    parser.add_argument("--admission-mbps", type=float, default=400.0, help="offered per flood")
    parser.add_argument("--pending-s", type=float, default=25.0)
    parser.add_argument("--pending-gib", type=int, default=8, help="stores out (pending)")
    parser.add_argument("--phases", default=",".join(PHASES), help="which, in this order")
    parser.add_argument("--io-threads", type=int, help="every gateway's io_threads (default 8)")
    parser.add_argument("--out", default="bench/results/backlog")
    return parser.parse_args(argv)


@contextmanager
def gateway_for(
    args: argparse.Namespace, name: str, settings: dict[str, Any]
) -> Iterator[SampledGateway]:
    workdir = args.dir / name
    workdir.mkdir(parents=True)
    if args.io_threads is not None:
        settings = {**settings, "io_threads": args.io_threads}
    config = gateways.write_config(workdir / "gateway.yaml", settings)
    gateway = SampledGateway(workdir, args.capacity, "--config", str(config))
    try:
        error = gateways.start(gateway)
        if error is not None:
            raise RuntimeError(f"the gateway did not start: {error}")
        yield gateway
    finally:
        gateway.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def start_floods(
    args: argparse.Namespace, gateway: Gateway, count: int, *flags: str
) -> list[Flooder]:
    floods = [Flooder(gateway.log_path.parent, f"flood{i}") for i in range(count)]
    try:
        for flood in floods:
            flood.start(gateway, "--object-mib", str(args.object_mib), *flags)
    except BaseException:
        for flood in floods:
            flood.kill()
        raise
    return floods


@contextmanager
def flooding(
    args: argparse.Namespace, gateway: Gateway, count: int, *flags: str
) -> Iterator[list[list[Any]]]:
    """``count`` flood processes run inside the block; the list it yields receives the records
    of all their stores when the block ends."""
    records: list[list[Any]] = []
    floods = start_floods(args, gateway, count, *flags)
    try:
        yield records
    finally:
        for flood in floods:
            records.extend(flood.finish())


@contextmanager
def probed(
    args: argparse.Namespace, name: str, seed: int
) -> Iterator[tuple[SampledGateway, Prober, str, memoryview]]:
    """A gateway whose windows and bound let several GB of stores queue, and a measuring
    session that has stored one object there: (gateway, prober, its key, its bytes)."""
    object_bytes = args.object_mib * MiB
    key, data = f"{plugin.MODEL}@probe@0@{0:064x}", _pattern(object_bytes, seed)
    settings = {"session_window_size": f"{args.window_mib}MiB", "store_backlog_max": "64GiB"}
    with gateway_for(args, name, settings) as gateway:
        prober = Prober(gateway, object_bytes)
        try:
            assert prober.store(key, data)[2]
            yield gateway, prober, key, data
        finally:
            prober.close()


def wait_for_depth(gateway: SampledGateway, depth_bytes: int, timeout_s: float = 120) -> float:
    started = time.monotonic()
    wait_until(lambda: gateway.backlog_bytes() >= depth_bytes, timeout_s, "the store backlog")
    return time.monotonic() - started


def window_filling(args: argparse.Namespace) -> list[str]:
    """Flood flags: as many stores out as a session's window holds, less one."""
    return ["--outstanding", str(args.window_mib // args.object_mib - 1)]


def run_backlog(args: argparse.Namespace) -> dict[str, Any]:
    with probed(args, "backlog", 1) as (gateway, prober, key, data):
        idle = [prober.load(key, data) for _ in range(args.loads + 1)][1:]
        with flooding(args, gateway, args.flooders, *window_filling(args)) as records:
            to_depth_s = wait_for_depth(gateway, int(args.depth_gib * GiB))
            busy = [_paced(prober.load(key, data)) for _ in range(args.loads)]
        return backlog_report.backlog(idle, busy, gateway.samples(), records, to_depth_s)


def run_fairness(args: argparse.Namespace) -> dict[str, Any]:
    with probed(args, "fairness", 2) as (gateway, prober, key, data):
        loads, stores = [], []
        with flooding(args, gateway, 1, *window_filling(args)) as records:
            wait_for_depth(gateway, min(int(args.depth_gib * GiB), args.window_mib * MiB // 2))
            for i in range(args.loads):
                loads.append(_paced(prober.load(key, data)))
                stores.append(prober.store(f"{plugin.MODEL}@b@0@{i + 1:064x}", data))
        return backlog_report.fairness(loads, stores, records, gateway.samples())


def run_admission(args: argparse.Namespace) -> dict[str, Any]:
    settings = {"session_window_size": f"{args.window_mib}MiB"}  # store_backlog_max: default
    offered = ["--offered-mbps", str(args.admission_mbps)]
    with gateway_for(args, "admission", settings) as gateway:
        with flooding(args, gateway, args.flooders, *window_filling(args), *offered) as records:
            time.sleep(args.admission_s)
        return backlog_report.admission(records, gateway.samples(), gateway.log())


def run_pending(args: argparse.Namespace) -> dict[str, Any]:
    outstanding = args.pending_gib * GiB // (args.object_mib * MiB)
    flags = ["--outstanding", str(outstanding), "--op-timeout-s", "10"]
    with gateway_for(args, "pending", {}) as gateway:
        with flooding(args, gateway, 1, *flags) as records:
            time.sleep(args.pending_s)
        return backlog_report.pending(records, gateway.samples(), outstanding * args.object_mib)


def run_one_session(args: argparse.Namespace) -> dict[str, Any]:
    # A session's stores hold at most half its window at the gateway; the rest wait in the
    # plugin's store lane, behind which no load queues, so deeper is unreachable here.
    reachable = GatewayConfig().session_window_size
    with probed(args, "one_session", 4) as (gateway, prober, key, data):
        idle = [prober.load(key, data) for _ in range(args.loads + 1)][1:]
        depth = min(int(args.depth_gib * GiB), reachable // 2)
        busy, records = prober.loads_behind_own_stores(key, data, depth, args.loads, gateway)
        report = backlog_report.backlog(idle, busy, gateway.samples(), records, 0.0)
        report["target_ratio_max"] = 1.5
        return report


PHASES = {
    "backlog": run_backlog,
    "fairness": run_fairness,
    "admission": run_admission,
    "pending": run_pending,
    "one_session": run_one_session,
}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "command": "python -m bench.backlog " + " ".join(sys.argv[1:] if argv is None else argv),
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "machine": machine(args.dir),
        "object_mib": args.object_mib,
        "flooders": args.flooders,
        "window_mib": args.window_mib,
        "io_threads": args.io_threads or GatewayConfig().io_threads,
    }
    for name in args.phases.split(","):
        print(f"phase {name} ...", flush=True)
        report[name] = PHASES[name](args)
    report["machine"]["loadavg_end"] = os.getloadavg()
    write_result(Path(args.out), "backlog", report)
    print(backlog_report.markdown(report))
    return 0


def _paced(sample: tuple[float, float]) -> tuple[float, float]:
    time.sleep(LOAD_PAUSE_S)
    return sample


def _pattern(size: int, seed: int) -> memoryview:
    return memoryview(np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes())


if __name__ == "__main__":
    sys.exit(main())
