"""What the start of a store costs inside LMCache's process: the plugin's own work, nothing else.

    python -m bench.store_start --dir /tmp/ss [--keys 32] [--object-mib 32] [--rounds 20]

On the H200 the slow lookup of a write-through is the first one after each store
(``a7353c1:bench/results/h200/adc2c30/``). This measures the part of a store's start that runs
in LMCache's process, with the gateway stopped (SIGSTOP) so that neither its work nor the disk's
takes a CPU: per round, one batch of ``--keys`` objects in a shared-memory L1 is submitted to a
real ``ADPConnector``, as LMCache's store controller does, and then

- the submit call's time (LMCache's thread, under its adapter lock);
- the link thread's longest step in the next 30 ms: admitting the batch and posting its
  requests, which holds the GIL (IOLoop._step, timed by wrapping it);
- how late a thread that sleeps 100 µs at a time wakes in those 30 ms, against the same thread
  while nothing is submitted: what any other thread of LMCache's (a lookup's) waits for the GIL.

Then the gateway is continued and the stores complete before the next round. Both paths: zero-copy
(the gateway reads L1) and the copy path (the copier fills the window; its threads release the
GIL while they copy). Writes OUT.json and OUT.md (``--out``, default bench/results/store_start).
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import numpy as np

from adp_wire.ring.layout import align_up
from bench import gateways
from bench.machine import machine
from bench.plugin import connect, object_keys, wait_connected
from bench.results import write as write_result
from lmcache_adp import ADPConnector, ioloop
from tests.support import Gateway, remove_tree

RESULTS = Path(__file__).parent / "results"
WATCH_S = 0.03  # how long after a submit the steps and the sleeper are watched
SLEEP_S = 0.0001


class Sleeper:
    """A thread that sleeps ``SLEEP_S`` at a time and records how late each wake-up is (ms)."""

    def __init__(self) -> None:
        self.late: list[tuple[float, float, float]] = []  # (went to sleep, woke, ms late)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sleeper", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            time.sleep(SLEEP_S)
            woke = time.perf_counter()
            self.late.append((started, woke, (woke - started - SLEEP_S) * 1e3))

    def worst(self, since: float, until: float) -> float:
        """The latest wake-up of the sleeps within [since, until]: ones that end later could
        have waited for this very computation."""
        return max(
            (ms for at, woke, ms in list(self.late) if since <= at and woke <= until), default=0.0
        )

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def timed_steps(steps: list[tuple[float, float]]) -> Callable[[], None]:
    """Wrap the link thread's step to record (start, ms) of each; returns the undo."""
    step = ioloop.IOLoop._step

    def timed(self: ioloop.IOLoop) -> None:
        started = time.perf_counter()
        step(self)
        steps.append((started, (time.perf_counter() - started) * 1e3))

    ioloop.IOLoop._step = timed  # type: ignore[method-assign]
    return lambda: setattr(ioloop.IOLoop, "_step", step)


def measure(
    gateway: Gateway, connector: ADPConnector, buffers: list[memoryview], rounds: int, first: int
) -> dict[str, Any]:
    steps: list[tuple[float, float]] = []
    undo = timed_steps(steps)
    sleeper = Sleeper()
    rows = []
    assert gateway.proc is not None
    try:
        for number in range(rounds):
            os.kill(gateway.proc.pid, signal.SIGSTOP)
            sleeper.late.clear()
            time.sleep(0.01)
            quiet = time.perf_counter()
            time.sleep(WATCH_S)
            idle_until = time.perf_counter()
            keys = object_keys(len(buffers), first=first + number * len(buffers))
            started = time.perf_counter()
            future = connector.submit_batch_set(keys, buffers)
            submit_ms = (time.perf_counter() - started) * 1e3
            time.sleep(WATCH_S)
            until = time.perf_counter()
            step_ms = max((ms for at, ms in list(steps) if at >= started), default=0.0)
            rows.append(
                {
                    "submit_ms": submit_ms,
                    "longest_step_ms": step_ms,
                    "sleeper_worst_ms": sleeper.worst(started, until),
                    "sleeper_worst_idle_ms": sleeper.worst(quiet, idle_until),
                }
            )
            os.kill(gateway.proc.pid, signal.SIGCONT)
            wait_done(connector, future)
    finally:
        os.kill(gateway.proc.pid, signal.SIGCONT)
        sleeper.stop()
        undo()
    return {
        "rows": rows,
        **{f"median_{k}": statistics.median(r[k] for r in rows) for k in rows[0]},
    }


def wait_done(connector: ADPConnector, future: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        select.select([connector.event_fd()], [], [], 1.0)
        for done, ok, error, _ in connector.drain_completions():
            if done == future:
                assert ok, f"a store failed: {error}"
                return
    raise TimeoutError("a store did not complete in 120 s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--keys", type=int, default=32, help="objects in one store batch")
    parser.add_argument("--object-mib", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out", default="store_start")
    args = parser.parse_args()
    object_bytes = args.object_mib * 2**20
    remove_tree(args.dir)
    args.dir.mkdir(parents=True)
    config = gateways.write_config(args.dir / "gateway.yaml", {"sync": "none"})
    capacity = gateways.capacity_for(2 * args.rounds * args.keys, object_bytes)
    gateway = Gateway(args.dir, capacity, "--config", str(config))
    segment = shared_memory.SharedMemory(  # named as `lmcache server --shm-name` names L1
        name=f"lmcache_l1_pool_store_start{os.getpid()}",
        create=True,
        size=args.keys * align_up(object_bytes),
    )
    report: dict[str, Any] = {
        "command": " ".join(["python -m bench.store_start", *sys.argv[1:]]),
        "machine": machine(args.dir),
        "keys": args.keys,
    }
    report["object_bytes"] = object_bytes
    try:
        assert gateways.start(gateway) is None, gateway.log()[-2000:]
        assert segment.buf is not None
        stride = align_up(object_bytes)
        buffers = [segment.buf[i * stride : i * stride + object_bytes] for i in range(args.keys)]
        for buffer in buffers:
            np.frombuffer(buffer, np.uint8)[:] = 7
        for number, (path, zero_copy) in enumerate((("zero-copy", True), ("copy", False))):
            connector = connect(gateway, zero_copy=zero_copy, op_timeout_s=120)
            try:
                wait_connected(connector)
                first = number * args.rounds * args.keys
                report[path] = measure(gateway, connector, buffers, args.rounds, first)
            finally:
                connector.close()
    finally:
        gateway.stop()
        segment.unlink()
        remove_tree(args.dir)
    write_result(RESULTS / args.out, "store_start", report)
    print(markdown(report))
    return 0


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"{m['cpus']} CPUs. One batch of {report['keys']} objects of "
        f"{report['object_bytes'] // 2**20} MiB in a shared-memory L1, submitted to a real "
        "ADPConnector with the gateway stopped; medians over rounds, ms.",
        "",
        "| path | submit call | link thread's longest step | a sleeper's worst lateness "
        "after the submit | the same, idle |",
        "|---|---|---|---|---|",
    ]
    for path in ("zero-copy", "copy"):
        r = report[path]
        lines.append(
            f"| {path} | {r['median_submit_ms']:.3f} | {r['median_longest_step_ms']:.3f} "
            f"| {r['median_sleeper_worst_ms']:.3f} | {r['median_sleeper_worst_idle_ms']:.3f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
