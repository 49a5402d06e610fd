"""Does copying L1 slow a Python workload in the same process more than in another process?

    python bench/results/lookup-copy/copy_elsewhere.py [ROUNDS]

The workload (dict lookups and hashing, a stand-in for LMCache's lookup) is timed idle and while
256 MiB is copied in 8 MiB slices (numpy ``copyto``, which releases the GIL) by one thread of
this process, by four, or by another process. If another process's copy costs the workload as
much as a thread's, the cost is the memory system and the cores, not the GIL.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import statistics
import sys
import threading
import time
from multiprocessing.synchronize import Event

import numpy as np

TOTAL = 256 * 2**20
SLICE = 8 * 2**20


def workload(table: dict[int, int]) -> float:
    """Milliseconds of dict lookups and hashing."""
    started = time.perf_counter()
    total = 0
    for i in range(20_000):
        total += table.get(i * 7919 % 200_000, 0)
    digest = hashlib.blake2b(b"x" * 64)
    for i in range(2_000):
        digest.update(i.to_bytes(4, "little"))
    return (time.perf_counter() - started) * 1e3


def copy(source: np.ndarray, destination: np.ndarray, threads: int) -> None:
    """Copy ``source`` into ``destination`` in slices, over ``threads`` threads."""

    def run(first: int) -> None:
        for at in range(first * SLICE, TOTAL, threads * SLICE):
            np.copyto(destination[at : at + SLICE], source[at : at + SLICE])

    workers = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


def copy_elsewhere(go: Event, done: Event) -> None:
    """In another process: one copy each time ``go`` is set, until ``done``."""
    source, destination = np.ones(TOTAL, np.uint8), np.ones(TOTAL, np.uint8)
    while True:
        go.wait()
        go.clear()
        if done.is_set():
            return
        copy(source, destination, 1)


def main(rounds: int) -> None:
    table = {i: i for i in range(200_000)}
    source, destination = np.ones(TOTAL, np.uint8), np.ones(TOTAL, np.uint8)
    for _ in range(20):
        workload(table)
    timings: dict[str, list[float]] = {"idle": [], "thread1": [], "thread4": [], "process": []}
    go, done = mp.Event(), mp.Event()
    other = mp.Process(target=copy_elsewhere, args=(go, done))
    other.start()
    time.sleep(1)
    for _ in range(rounds):
        timings["idle"].append(workload(table))
        time.sleep(0.02)
        for name, threads in (("thread1", 1), ("thread4", 4)):
            copying = threading.Thread(target=copy, args=(source, destination, threads))
            copying.start()
            time.sleep(0.002)
            timings[name].append(workload(table))
            copying.join()
            time.sleep(0.02)
        go.set()
        time.sleep(0.005)
        timings["process"].append(workload(table))
        time.sleep(0.1)
    done.set()
    go.set()
    other.join()
    for name, values in timings.items():
        print(f"{name:8s} p50 {statistics.median(values):.2f} ms  max {max(values):.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 30)
