"""The disk's floor: what O_DIRECT alone moves, measured by fio and by a Python probe of the same
shape, in the run that uses it. Every benchmark table takes its floor from here.

    python -m bench.floor --dir /path/on/the/disk [--sizes-kb 256,4096,32768] [--file-gib 4] \\
        [--out bench/results/floor]

Shapes (``Shape``: block size, jobs, queue depth per job):

- the gateway's own, per object size (``gateway_shapes``): the I/O size it issues (a record is
  a 4 KiB header and the payload; an object of several fragments on one database is one
  vectored write or read), as many synchronous writers as ``io_threads`` and
  ``store_inflight_max`` let run at once, and ``io_threads`` readers;
- a few deep shapes (``BEST_SHAPES``; on the project's VM, 4 MiB at queue depth 8 was the best
  in every earlier study).

The floor of a direction is the faster of the two tools: "the floor at the gateway's shape" at
that shape, "the floor's best" over every shape (``best``). Each is a floor only if nothing
beats it: where the Python probe outruns fio (on tmpfs, where O_DIRECT is a copy from memory,
fio's reads trail a plain ``preadv`` several times over), fio alone would be beaten.

Method: one file of ``--file-gib`` under ``--dir``, written once (fio, 4 MiB at qd 8: its rate
is reported as "first lap", the cost of writing blocks a file never held), then every shape
overwrites it and reads it back, fio and the Python probe in turn, so both see the same blocks.
All I/O is O_DIRECT, so the guest's page cache is not involved (the host's cannot be seen).
Without fio (``ensure_fio`` installs it with apt-get when it can), ``dd`` stands in for fio at
4 MiB, one stream.

Runs on the H200 host too (bench/h200.sh): it needs only the standard library, PyYAML and
this repository.
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
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from adp_gateway.card.software.format import HEADER_BYTES
from adp_gateway.config import GatewayConfig
from adp_gateway.scheduling.write_depth import FLOOR_BYTES
from adp_wire import fragmenter
from adp_wire.ring.layout import align_up
from bench.results import write as write_result

ROOT = Path(__file__).resolve().parent.parent
LOCAL_FIO = ROOT / ".fio" / "fio"  # a static build carried to hosts without fio (bench/README.md)
FIO_RUNTIME_S_MAX = 30
MiB = 2**20


@dataclass(frozen=True)
class Shape:
    """``jobs`` sequential streams, each over its own slice of the file with ``depth`` I/Os of
    ``block_bytes`` in flight (fio: libaio at that depth, or psync at depth 1; the Python probe:
    ``depth`` threads per stream taking its offsets in turn, one pwritev/preadv at a time)."""

    name: str
    block_bytes: int
    jobs: int
    depth: int = 1


BEST_SHAPES = (
    Shape("4 MiB, qd 8", 4 * MiB, 1, 8),
    Shape("1 MiB, qd 32", 1 * MiB, 1, 32),
    Shape("16 MiB, 2 jobs x qd 4", 16 * MiB, 2, 4),
)


def gateway_shapes(object_bytes: int, config: GatewayConfig | None = None) -> dict[str, Shape]:
    """The write and read shapes the gateway issues for objects of ``object_bytes`` on one
    database: one I/O per object (its fragments' records back to back), as many at once as
    its I/O threads and ``store_inflight_max`` let run, all in one sequential stream (its
    threads append to the same open region, and read back what was written in order)."""
    config = config or GatewayConfig()
    fragments = fragmenter.plan(object_bytes, config.fragment_size, 1, 0)
    io_bytes = sum(HEADER_BYTES + align_up(f.length) for f in fragments)
    depth = config.store_inflight_max or FLOOR_BYTES  # the least the write depth allows
    writers = max(1, min(config.io_threads, depth // max(object_bytes, 1)))
    label = _size_label(object_bytes)
    return {
        "write": Shape(f"gateway writes, {label} objects", io_bytes, 1, writers),
        "read": Shape(f"gateway reads, {label} objects", io_bytes, 1, config.io_threads),
    }


def ensure_fio() -> str | None:
    """The fio binary: on PATH, the static build in .fio/, or installed now with apt-get (as
    root); None when none can be had (then dd stands in)."""
    found = shutil.which("fio") or (str(LOCAL_FIO) if LOCAL_FIO.exists() else None)
    if found or os.geteuid() != 0 or not shutil.which("apt-get"):
        return found
    print("fio is not installed: apt-get install -y fio", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    done = subprocess.run(["apt-get", "install", "-y", "fio"], capture_output=True, env=env)
    if done.returncode != 0:
        print(f"apt-get could not install fio: {done.stderr.decode()[-300:]}", flush=True)
    return shutil.which("fio")


def measure(
    directory: Path,
    shapes: list[Shape],
    file_bytes: int,
    fio: str | None = None,
    python_probe: bool = True,
) -> dict[str, Any]:
    """Write ``file_bytes`` once, then each shape's write and read with fio (or dd) and the
    Python probe. GB/s = 10^9 bytes/s."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "floor.bin"
    path.unlink(missing_ok=True)
    result: dict[str, Any] = {"file_bytes": file_bytes, "fio": fio, "shapes": []}
    try:
        first = Shape("first lap, 4 MiB, qd 8", 4 * MiB, 1, 8)
        result["first_lap_write_GBps"] = _tool_rate(fio, path, first, "write", file_bytes)
        for shape in shapes:
            row: dict[str, Any] = {**asdict(shape)}
            for direction in ("write", "read"):
                row[f"{direction}_GBps"] = _tool_rate(fio, path, shape, direction, file_bytes)
                if python_probe:
                    rate = probe(path, shape, direction, file_bytes)
                    row[f"python_{direction}_GBps"] = rate
            result["shapes"].append(row)
            print(json.dumps(row), flush=True)
    finally:
        path.unlink(missing_ok=True)
    return result


def floors(directory: Path, sizes_bytes: list[int], file_bytes: int) -> dict[str, Any]:
    """The floor for each object size (the gateway's shapes) and fio's best, in one run."""
    fio = ensure_fio()
    shapes: list[Shape] = list(BEST_SHAPES)
    per_size: dict[int, dict[str, Shape]] = {}
    for size in sizes_bytes:
        per_size[size] = gateway_shapes(size)
        for shape in per_size[size].values():
            if shape not in shapes:
                shapes.append(shape)
    started = time.time()
    measured = measure(directory, shapes, file_bytes, fio)
    rows = {r["name"]: r for r in measured["shapes"]}
    summary: dict[str, Any] = {
        "tool": "fio" if fio else "dd",
        "first_lap_write_GBps": measured["first_lap_write_GBps"],
        "sizes": {},
    }
    for size, pair in per_size.items():
        write, read = rows[pair["write"].name], rows[pair["read"].name]
        summary["sizes"][str(size)] = {
            "write_shape": asdict(pair["write"]),
            "read_shape": asdict(pair["read"]),
            "write_GBps": write["write_GBps"],
            "read_GBps": read["read_GBps"],
            "python_write_GBps": write.get("python_write_GBps"),
            "python_read_GBps": read.get("python_read_GBps"),
        }
    summary["measured"] = measured
    summary["seconds"] = round(time.time() - started, 1)
    return summary


def for_size(floor: dict[str, Any], object_bytes: int) -> dict[str, float]:
    """The figures a table row of ``object_bytes`` objects compares with: per direction, the
    faster tool at the gateway's shape, and ``best``."""
    size = floor["sizes"][str(object_bytes)]
    return {
        "gateway_shape_write_GBps": _faster(size, "write"),
        "gateway_shape_read_GBps": _faster(size, "read"),
        "best_write_GBps": best(floor, "write"),
        "best_read_GBps": best(floor, "read"),
    }


def best(floor: dict[str, Any], direction: str) -> float:
    """The fastest ``direction`` ("write" or "read") of every shape and either tool."""
    return max(_faster(row, direction) for row in floor["measured"]["shapes"])


def _faster(figures: dict[str, Any], direction: str) -> float:
    """The faster of fio (or dd) and the Python probe, where both measured it."""
    measured = (figures.get(f"{direction}_GBps"), figures.get(f"python_{direction}_GBps"))
    return max(figure for figure in measured if figure is not None)


def limit(directory: Path, total_bytes: int, write: Shape, read: Shape) -> dict[str, Any]:
    """The floor of one workload: ``total_bytes`` written in the ``write`` shape and read in
    the ``read`` shape, by fio (or dd) and the Python probe; each direction's figure is the
    better of the two tools."""
    shapes = [write] if write == read else [write, read]
    measured = measure(directory, shapes, total_bytes, ensure_fio())
    rows = {row["name"]: row for row in measured["shapes"]}
    w, r = rows[write.name], rows[read.name]
    return {
        "total_bytes": total_bytes,
        "io_bytes": write.block_bytes,
        "threads": write.jobs * write.depth,
        "read_io_bytes": read.block_bytes,
        "read_threads": read.jobs * read.depth,
        "write_GBps": max(w["write_GBps"], w.get("python_write_GBps") or 0.0),
        "read_GBps": max(r["read_GBps"], r.get("python_read_GBps") or 0.0),
        "tool": "fio" if measured["fio"] else "dd",
        "measured": measured,
    }


def _tool_rate(fio: str | None, path: Path, shape: Shape, direction: str, file_bytes: int) -> float:
    if fio is not None:
        return run_fio(fio, path, shape, direction, file_bytes)
    return run_dd(path, direction, file_bytes)


def run_fio(fio: str, path: Path, shape: Shape, direction: str, file_bytes: int) -> float:
    """GB/s of one fio job: ``shape.jobs`` jobs over disjoint slices of the file, O_DIRECT."""
    slice_bytes = max(
        shape.block_bytes, file_bytes // shape.jobs // shape.block_bytes * shape.block_bytes
    )
    argv = [
        fio,
        "--name=floor",
        f"--filename={path}",
        "--direct=1",
        f"--rw={direction}",
        f"--bs={shape.block_bytes}",
        f"--ioengine={'psync' if shape.depth == 1 else 'libaio'}",
        f"--iodepth={shape.depth}",
        f"--numjobs={shape.jobs}",
        f"--size={slice_bytes}",
        f"--offset_increment={slice_bytes}",
        f"--runtime={FIO_RUNTIME_S_MAX}",
        "--group_reporting",
        "--output-format=json",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=FIO_RUNTIME_S_MAX * 4)
    if done.returncode != 0:
        raise RuntimeError(f"fio failed: {' '.join(argv)}\n{done.stderr[-2000:]}")
    job = json.loads(done.stdout[done.stdout.index("{") :])["jobs"][0]
    return float(job[direction]["bw_bytes"]) / 1e9


def run_dd(path: Path, direction: str, file_bytes: int) -> float:
    """GB/s of dd at 4 MiB, one stream, O_DIRECT (where fio is missing)."""
    count = file_bytes // (4 * MiB)
    if direction == "write":
        argv = ["dd", "if=/dev/zero", f"of={path}", "bs=4M", f"count={count}", "oflag=direct"]
        argv.append("conv=notrunc,fdatasync")
    else:
        argv = ["dd", f"if={path}", "of=/dev/null", "bs=4M", f"count={count}", "iflag=direct"]
    started = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    return count * 4 * MiB / (time.perf_counter() - started) / 1e9


WriteOrRead = Callable[[int, list[memoryview], int], int]


def probe(path: Path, shape: Shape, direction: str, file_bytes: int) -> float:
    """GB/s of Python threads doing what the gateway does: O_DIRECT pwritev/preadv of
    ``shape.block_bytes`` from page-aligned buffers, one I/O at a time per thread; each of
    ``jobs`` slices of the file is one stream whose ``depth`` threads take its offsets in turn."""
    block = shape.block_bytes
    slice_bytes = max(block, file_bytes // shape.jobs // block * block)
    streams = [
        range(job * slice_bytes + t * block, (job + 1) * slice_bytes, shape.depth * block)
        for job in range(min(shape.jobs, file_bytes // slice_bytes))
        for t in range(shape.depth)
    ]
    call: WriteOrRead = os.pwritev if direction == "write" else os.preadv
    fd = os.open(path, os.O_RDWR | os.O_DIRECT)
    try:
        workers = [threading.Thread(target=_io_worker, args=(fd, call, block, s)) for s in streams]
        started = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        if direction == "write":
            os.fdatasync(fd)
        moved = sum(len(offsets) for offsets in streams) * block
        return moved / (time.perf_counter() - started) / 1e9
    finally:
        os.close(fd)


def _io_worker(fd: int, call: WriteOrRead, io_bytes: int, offsets: range) -> None:
    buf = memoryview(mmap.mmap(-1, io_bytes))  # page aligned, as O_DIRECT requires
    pattern = os.urandom(4096)
    buf[:] = pattern * (io_bytes // 4096)
    for offset in offsets:
        call(fd, [buf], offset)


def _size_label(size_bytes: int) -> str:
    return f"{size_bytes // MiB} MiB" if size_bytes % MiB == 0 else f"{size_bytes // 1024} KiB"


def table(floor: dict[str, Any]) -> str:
    """Markdown: every shape measured, fio (or dd) and the Python probe, MB/s."""
    tool = floor["tool"]
    lines = [
        f"| shape | block | jobs x depth | {tool} write | Python write | {tool} read "
        "| Python read |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in floor["measured"]["shapes"]:
        cells = [
            row["name"],
            _size_label(row["block_bytes"])
            if row["block_bytes"] % 1024 == 0
            else str(row["block_bytes"]),
            f"{row['jobs']} x {row['depth']}",
            *(
                _mbps(row.get(k))
                for k in ("write_GBps", "python_write_GBps", "read_GBps", "python_read_GBps")
            ),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append(
        f"\nThe floor's best ({tool} or the Python probe): write {_mbps(best(floor, 'write'))} "
        f"MB/s, read {_mbps(best(floor, 'read'))} MB/s; first lap over a new file (4 MiB, qd "
        f"8): {_mbps(floor['first_lap_write_GBps'])} MB/s."
    )
    return "\n".join(lines)


def report(result: dict[str, Any]) -> str:
    """Markdown of a bench.floor result: its table."""
    return table(result["floor"]) + "\n"


def _mbps(gbps: float | None) -> str:
    return "-" if gbps is None else f"{gbps * 1e3:.0f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True, help="on the disk under test")
    parser.add_argument("--sizes-kb", default="256,4096,32768", help="object sizes")
    parser.add_argument("--file-gib", type=float, default=4.0, help="the file every shape moves")
    parser.add_argument("--out", type=Path, help="path without extension for .json and .md")
    args = parser.parse_args(argv)
    sizes = [int(s) * 1024 for s in args.sizes_kb.split(",")]
    floor = floors(args.dir, sizes, int(args.file_gib * 2**30) // MiB * MiB)
    text = table(floor)
    print(text)
    if args.out is not None:
        command = " ".join(["python -m bench.floor", *(argv if argv is not None else sys.argv[1:])])
        result = {"command": command, "loadavg": os.getloadavg(), "floor": floor}
        write_result(args.out, "floor", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
