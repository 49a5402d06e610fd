"""Every storage benchmark side by side in one run, written as one JSON and one markdown table.

    .venv/bin/python -m bench.storage --dir /tmp/benchdir            # full run
    .venv/bin/python -m bench.storage --dir /tmp/benchdir --quick    # smoke run, < 2 minutes

``--dir`` is a directory on the disk under test; everything is written there and removed after.
Sections (``--sections``, all by default), each also runnable alone:

- ``throughput`` (bench/matrix.py): lmcache-adp with each sync policy against fs_native
  (O_DIRECT and buffered) through LMCache's ``lmcache bench l2``, stores then loads from a new
  process, over object sizes x keys per submit x submits in flight, against the disk's floor
  (bench/floor.py: fio and a Python probe) in the same run; CPU seconds per GB of the gateway
  and of the harness process. ``--quick`` runs the matrix's quick form.
- ``exists`` (bench/exists.py): EXISTS p50/p99 for 1 and 1,000 keys through the plugin against
  a gateway holding ``--exists-objects`` objects, and inside the gateway (its own code path, in
  process) over a store of ``--index-entries`` objects.
- ``restart`` (bench/restart.py): ``--restart-objects`` objects, stopped by SIGTERM and by
  SIGKILL, then the time from launching ``python -m adp_gateway serve`` to the first EXISTS hit.

The full run writes bench/results/storage.json and storage.md; ``--quick`` (small sizes and
counts, each overridable) writes storage-quick.json and storage-quick.md, so a smoke run never
replaces a full result. A section that fails is recorded under "failures" and the others run;
the exit status is then 1.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import exists, matrix, matrix_report, restart
from bench.machine import machine
from bench.results import write as write_result

SECTIONS = ("throughput", "exists", "restart")
FULL = {
    "exists_objects": 10_000,
    "index_entries": 100_000,
    "exists_rounds": 500,
    "restart_objects": 100_000,
    "out": "bench/results/storage",
}
QUICK = {
    "exists_objects": 2_000,
    "index_entries": 20_000,
    "exists_rounds": 100,
    "restart_objects": 5_000,
    "out": "bench/results/storage-quick",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True, help="on the disk under test")
    parser.add_argument("--quick", action="store_true", help="smoke run: small sizes and counts")
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--matrix-args", default="", help="passed on to bench.matrix")
    parser.add_argument("--object-kb", type=int, default=4, help="EXISTS and restart objects")
    parser.add_argument("--exists-objects", type=int, help="stored through the plugin")
    parser.add_argument("--index-entries", type=int, help="in the in-process store")
    parser.add_argument("--exists-rounds", type=int, help="samples per batch size")
    parser.add_argument("--restart-objects", type=int)
    parser.add_argument("--restart-signals", default="TERM,KILL")
    parser.add_argument("--out", help="path without extension for .json and .md")
    args = parser.parse_args(argv)
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    unknown = set(args.sections.split(",")) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    out_json, out_md = Path(f"{args.out}.json"), Path(f"{args.out}.md")
    out_json.parent.mkdir(parents=True, exist_ok=True)
    started = time.time()
    report: dict[str, Any] = {
        "command": " ".join(["python -m bench.storage", *sys.argv[1:]]),
        "started": time.strftime("%Y-%m-%d %H:%M:%S +0000", time.gmtime(started)),
        "machine": machine(args.dir),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "failures": {},
    }
    sections: dict[str, Callable[[], Any]] = {
        "throughput": lambda: matrix.run(
            matrix.parse_args(
                ["--dir", str(args.dir / "matrix"), "--out", f"{args.out}-matrix"]
                + (["--quick"] if args.quick else [])
                + args.matrix_args.split()
            )
        ),
        "exists": lambda: exists.run(
            args.dir,
            args.exists_objects,
            args.index_entries,
            args.exists_rounds,
            args.object_kb * 1024,
        ),
        "restart": lambda: restart.run(
            args.dir, args.restart_objects, args.object_kb * 1024, args.restart_signals.split(",")
        ),
    }
    for name in args.sections.split(","):
        began = time.perf_counter()
        print(f"== {name}", flush=True)
        try:
            report[name] = sections[name]()
            for where, why in failed_parts(report[name], name):
                report["failures"][where] = why
        except Exception as exc:
            traceback.print_exc()
            report["failures"][name] = f"{type(exc).__name__}: {exc}"[-4000:]
        report.setdefault("section_seconds", {})[name] = round(time.perf_counter() - began, 1)
        write(report, out_json, out_md)  # after each section: a crash keeps the rest
    report["seconds"] = round(time.time() - started, 1)
    report["machine"]["loadavg_end"] = os.getloadavg()
    write(report, out_json, out_md)
    print(out_md.read_text())
    print(f"wrote {out_json} and {out_md}")
    return 1 if report["failures"] else 0


def failed_parts(result: Any, where: str) -> list[tuple[str, str]]:
    """Every ``{"failed": why}`` inside a section's result, with where it is."""
    if isinstance(result, dict):
        why = result.get("failed")
        found = [(where, why)] if isinstance(why, str) else []
        for key, value in result.items():
            found += failed_parts(value, f"{where}.{key}")
        return found
    if isinstance(result, list):
        return [f for i, value in enumerate(result) for f in failed_parts(value, f"{where}[{i}]")]
    return []


def _found(result: Any, key: str) -> list[Any]:
    """Every value under ``key`` anywhere inside ``result``."""
    if isinstance(result, dict):
        here = [result[key]] if key in result else []
        return here + [v for value in result.values() for v in _found(value, key)]
    if isinstance(result, list):
        return [v for value in result for v in _found(value, key)]
    return []


def write(report: dict[str, Any], out_json: Path, out_md: Path) -> None:
    write_result(out_json.with_suffix(""), "storage", report)


def markdown(report: dict[str, Any]) -> str:
    machine_info = report["machine"]
    parts = [
        f"{machine_info['cpus']} CPUs, load average {machine_info['loadavg_start'][0]:.2f} at "
        f"start, `{machine_info['dir_filesystem']}`. MB/s = 10^6 bytes/s.",
    ]
    if "throughput" in report:
        text = matrix_report.markdown(report["throughput"])
        parts += ["", *("#" + line if line.startswith("#") else line for line in text.splitlines())]
    if "exists" in report:
        parts += ["", "## EXISTS latency", "", exists.table(report["exists"])]
    if "restart" in report:
        parts += ["", "## Restart", "", restart.table(report["restart"])]
    drops = [d for section in SECTIONS for d in _found(report.get(section), "sessions_dropped")]
    count = sum(int(d["count"]) for d in drops)
    if count:
        first = next(d["first"] for d in drops if d["first"])
        parts += ["", f"**The gateway dropped {count} session(s)** for a protocol error: `{first}`"]
    for name, why in report["failures"].items():
        parts += ["", f"**{name} failed**: `{why.splitlines()[-1] if why else why}`"]
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    sys.exit(main())
