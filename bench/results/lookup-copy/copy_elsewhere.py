"""Does copying L1 slow a Python workload in the same process more than in another process?
Workload: a dict/hash-heavy Python function (~2-4 ms), timed idle and while 256 MiB is copied in
8 MiB slices (numpy copyto, GIL released) by (a) 1 thread here, (b) 4 threads here, (c) another
process."""
import multiprocessing as mp, os, statistics, sys, threading, time
import numpy as np
import hashlib

def workload(table):
    t = time.perf_counter()
    acc = 0
    for i in range(20000):
        acc += table.get(i * 7919 % 200000, 0)
    h = hashlib.blake2b(b"x" * 64)
    for i in range(2000):
        h.update(i.to_bytes(4, "little"))
    return (time.perf_counter() - t) * 1e3

SRC = DST = None
def copier(nthreads, total, stop_evt=None):
    src, dst = SRC, DST
    slice_ = 8 << 20
    def run(k):
        for at in range(k * slice_, total, nthreads * slice_):
            np.copyto(dst[at:at + slice_], src[at:at + slice_])
    ts = [threading.Thread(target=run, args=(k,)) for k in range(nthreads)]
    [t.start() for t in ts]; [t.join() for t in ts]

def proc_copier(go, done):
    src = np.ones(256 << 20, np.uint8); dst = np.empty(256 << 20, np.uint8)
    while True:
        go.wait(); go.clear()
        if done.is_set(): return
        for at in range(0, 256 << 20, 8 << 20):
            np.copyto(dst[at:at + (8 << 20)], src[at:at + (8 << 20)])

if __name__ == "__main__":
    table = {i: i for i in range(200000)}
    SRC = np.ones(256 << 20, np.uint8); DST = np.ones(256 << 20, np.uint8)
    for _ in range(20): workload(table)
    res = {"idle": [], "thread1": [], "thread4": [], "process": []}
    go, done = mp.Event(), mp.Event()
    p = mp.Process(target=proc_copier, args=(go, done)); p.start(); time.sleep(1)
    for r in range(int(sys.argv[1]) if len(sys.argv) > 1 else 30):
        res["idle"].append(workload(table)); time.sleep(0.02)
        for name, n in (("thread1", 1), ("thread4", 4)):
            th = threading.Thread(target=copier, args=(n, 256 << 20)); th.start(); time.sleep(0.002)
            res[name].append(workload(table)); th.join(); time.sleep(0.02)
        go.set(); time.sleep(0.005)
        res["process"].append(workload(table)); time.sleep(0.1)
    done.set(); go.set(); p.join()
    for k, v in res.items():
        v.sort(); print(f"{k:8s} p50 {statistics.median(v):.2f} ms  max {v[-1]:.2f}")
