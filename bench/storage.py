"""Every storage benchmark side by side in one run, written as one JSON and one markdown table.

    .venv/bin/python -m bench.storage --dir /tmp/benchdir            # full run
    .venv/bin/python -m bench.storage --dir /tmp/benchdir --quick    # smoke run, < 2 minutes

``--dir`` is a directory on the disk under test; everything is written there and removed after.
Sections (``--sections``, all by default), each also runnable alone:

- ``throughput`` (bench/compare_l2.py): the disk's O_DIRECT limit (bench/device.py), then
  LMCache's harness ``lmcache bench l2 --l1-align-bytes 4096`` (store in one process, load in a
  new one) on lmcache-adp once per sync policy (``--sync-policies``; one the gateway rejects is
  recorded and skipped), and on fs_native with use_odirect true and false, at each object size;
  gateway CPU seconds per GB moved.
- ``exists`` (bench/exists.py): EXISTS p50/p99 for 1 and 1,000 keys through the plugin against
  a gateway holding ``--exists-objects`` objects, and inside the gateway (its own code path, in
  process) over a store of ``--index-entries`` objects.
- ``restart`` (bench/restart.py): ``--restart-objects`` objects, stopped by SIGTERM and by
  SIGKILL, then the time from launching ``python -m gateway serve`` to the first EXISTS hit.

The full run writes bench/results/storage.json and storage.md; ``--quick`` (small sizes and
counts, each overridable) writes storage-quick.json and storage-quick.md, so a smoke run never
replaces a full result. A section that fails is recorded under "failures" and the others run;
the exit status is then 1.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import compare_l2, exists, restart

SECTIONS = ("throughput", "exists", "restart")
FULL = {
    "sizes_kb": "256,4096,32768",
    "keys": 8,
    "probe_min_mb": 256,
    "exists_objects": 10_000,
    "index_entries": 100_000,
    "exists_rounds": 500,
    "restart_objects": 100_000,
    "out": "bench/results/storage",
}
QUICK = {
    "sizes_kb": "4096",
    "keys": 2,
    "probe_min_mb": 64,
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
    parser.add_argument("--sizes-kb", help=f"object sizes (full: {FULL['sizes_kb']})")
    parser.add_argument("--keys", type=int, help="harness keys per submit, 2 in flight")
    parser.add_argument("--probe-min-mb", type=int, help="least data the disk probe moves")
    parser.add_argument("--sync-policies", default=compare_l2.POLICIES)
    parser.add_argument("--sync-interval-ms", type=int, default=50, help="for periodic")
    parser.add_argument(
        "--load-every-policy", action="store_true", help="not only the first policy loads"
    )
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
    policies = args.sync_policies.split(",")
    started = time.time()
    report: dict[str, Any] = {
        "command": " ".join(["python -m bench.storage", *sys.argv[1:]]),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(started)),
        "machine": machine(args.dir),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "failures": {},
    }
    sections: dict[str, Callable[[], Any]] = {
        "throughput": lambda: compare_l2.run(
            args.dir,
            [int(s) for s in args.sizes_kb.split(",")],
            args.keys,
            policies,
            args.sync_interval_ms,
            args.probe_min_mb * 2**20,
            args.load_every_policy,
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
        write(report, policies, out_json, out_md)  # after each section: a crash keeps the rest
    report["seconds"] = round(time.time() - started, 1)
    report["machine"]["loadavg_end"] = os.getloadavg()
    write(report, policies, out_json, out_md)
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


def write(report: dict[str, Any], policies: list[str], out_json: Path, out_md: Path) -> None:
    out_json.write_text(json.dumps(report, indent=1) + "\n")
    out_md.write_text(markdown(report, policies))


def markdown(report: dict[str, Any], policies: list[str]) -> str:
    machine_info = report["machine"]
    parts = [
        "# Storage benchmarks",
        "",
        f"`{report['command']}` — {report['started']}, commit {machine_info['commit']}, "
        f"{machine_info['cpus']} CPUs, load average {machine_info['loadavg_start'][0]:.2f} at "
        f"start, `{machine_info['dir_filesystem']}`. MB/s = 10^6 bytes/s.",
    ]
    if "throughput" in report:
        parts += [
            "",
            "## Throughput through `lmcache bench l2` (cold loads from a new process)",
            "",
            compare_l2.table(report["throughput"], policies),
            "",
            "## lmcache-adp per sync policy",
            "",
            compare_l2.sync_table(report["throughput"], policies),
        ]
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


def machine(directory: Path) -> dict[str, Any]:
    """What the numbers depend on: the code, the CPUs and how busy they were, the filesystem."""
    commit = _git("rev-parse", "--short", "HEAD")
    if _git("status", "--porcelain", "--untracked-files=no"):
        commit += " (with uncommitted changes)"
    return {
        "commit": commit,
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
        "dir_filesystem": _filesystem(directory),
    }


def _git(*args: str) -> str:
    try:
        done = subprocess.run(["git", *args], capture_output=True, text=True, timeout=30)
    except OSError:
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def _filesystem(directory: Path) -> str:
    """``device on mountpoint type fstype`` of the mount holding ``directory``."""
    path = str(directory.resolve())
    best = ("", "?", "?")
    with open("/proc/mounts") as mounts:
        for line in mounts:
            device, mountpoint, fstype = line.split()[:3]
            inside = path == mountpoint or path.startswith(mountpoint.rstrip("/") + "/")
            if inside and len(mountpoint) >= len(best[0]):
                best = (mountpoint, device, fstype)
    return f"{best[1]} on {best[0]} type {best[2]}"


if __name__ == "__main__":
    sys.exit(main())
