"""O_DIRECT reads of 11.25 MiB (a restore chunk) by THREADS threads from one file, into a pool
of pre-touched buffers of one kind, and the disk's requests they made (from /proc/diskstats):

    python bench/results/hugepages/destprobe.py FILE THREADS KIND:SLOTS[,KIND:SLOTS...] [DISK]

KIND: anon (private mmap), huge (private mmap, MADV_HUGEPAGE), memfd (shared, as a session's
window before the change), shmthp (shared, MADV_HUGEPAGE: the window now), hugetlb (memfd with
MFD_HUGETLB; needs vm.nr_hugepages). Read i goes into slot i % SLOTS. FILE must hold 160 chunks
(1.8 GB) written with O_DIRECT; ROUNDS (env, default 2) rounds over all kinds.
"""

import mmap
import os
import sys
import threading
import time

CHUNK = 11 * 2**20 + 2**18
CHUNKS = 160
HUGE = 2 * 2**20


def pool(kind: str, slots: int) -> list[memoryview]:
    if kind in ("anon", "huge"):
        maps = [mmap.mmap(-1, CHUNK) for _ in range(slots)]
        if kind == "huge":
            for m in maps:
                m.madvise(mmap.MADV_HUGEPAGE)
        buffers = [memoryview(m) for m in maps]
    else:
        size = -(-CHUNK * slots // HUGE) * HUGE
        fd = os.memfd_create("probe", os.MFD_HUGETLB if kind == "hugetlb" else 0)
        os.ftruncate(fd, size)
        mapping = mmap.mmap(fd, size)
        os.close(fd)
        if kind == "shmthp":
            mapping.madvise(mmap.MADV_HUGEPAGE)
        whole = memoryview(mapping)
        buffers = [whole[i * CHUNK : (i + 1) * CHUNK] for i in range(slots)]
    for buffer in buffers:
        buffer[:] = b"\1" * CHUNK
    return buffers


def disk_reads(disk: str) -> tuple[int, int]:
    with open("/proc/diskstats") as stats:
        for line in stats:
            fields = line.split()
            if fields[2] == disk:
                return int(fields[3]), int(fields[5])
    raise SystemExit(f"no disk {disk} in /proc/diskstats")


def read_all(fd: int, threads: int, buffers: list[memoryview]) -> float:
    lock, taken = threading.Lock(), [0]

    def work() -> None:
        while True:
            with lock:
                i = taken[0]
                taken[0] += 1
            if i >= CHUNKS:
                return
            os.preadv(fd, [buffers[i % len(buffers)]], i * CHUNK)

    started = time.perf_counter()
    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return time.perf_counter() - started


def main() -> None:
    path, threads = sys.argv[1], int(sys.argv[2])
    variants = [(v.split(":")[0], int(v.split(":")[1])) for v in sys.argv[3].split(",")]
    disk = sys.argv[4] if len(sys.argv) > 4 else "vda"
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    for round_ in range(int(os.environ.get("ROUNDS", "2"))):
        for kind, slots in variants:
            buffers = pool(kind, slots)
            (reads0, sectors0) = disk_reads(disk)
            seconds = read_all(fd, threads, buffers)
            (reads1, sectors1) = disk_reads(disk)
            kib = (sectors1 - sectors0) * 512 / max(1, reads1 - reads0) / 1024
            print(
                f"round {round_} threads {threads} {kind}:{slots:<4d} "
                f"{CHUNKS * CHUNK / seconds / 1e9:.2f} GB/s, "
                f"{reads1 - reads0} requests of {kib:.0f} KiB on average",
                flush=True,
            )


if __name__ == "__main__":
    main()
