"""bench/results/: one result per benchmark and machine, its Markdown rendered from its JSON.

    python -m bench.results            # rewrites every bench/results/*.md from its JSON
    python -m bench.results --check    # changes nothing; exit 1 naming each file out of date

A result is ``NAME-MACHINE.json`` beside ``NAME-MACHINE.md``: NAME is a benchmark's name, or that
name and one of the variants it declares below (``matrix-tmpfs``: the same benchmark with every
contender's storage on tmpfs); MACHINE is one of ``MACHINES``. The JSON says which benchmark made
it (``benchmark``: its module under bench/), and carries ``command``, ``commit`` and ``date``; the
Markdown is a header made of those and the machine, then the benchmark's own report of the JSON.
A benchmark writes both with ``write()``; a new run of one replaces the file it measured before,
and git keeps the old one.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.machine import commit_of_checkout

RESULTS = Path(__file__).resolve().parent / "results"
# Files in RESULTS that are not results.
INDEX = "README.md"

MACHINES = {
    "vm": "the project's 2-core KVM guest (24 GiB; ext4 on a virtio disk; other engineers' jobs "
    "run beside it)",
    "h100": "a GPU host: one NVIDIA H100 80GB, 16 cores, a virtio disk",
    "h200": "a GPU host: one NVIDIA H200, 16 cores, a virtio disk",
}


@dataclass(frozen=True)
class Benchmark:
    """One module of bench/ that writes results, and how its report is read."""

    name: str  # the results file's name starts with it
    title: str
    report: str  # "module:function" turning the JSON into the Markdown's body
    variants: dict[str, str] = field(default_factory=dict)  # the name's middle -> what differs


BENCHMARKS = {
    "matrix": Benchmark(
        "matrix",
        "lmcache-adp against fs_native through `lmcache bench l2`, and the disk's floor",
        "bench.matrix_report:markdown",
        {
            "tmpfs": "every contender's storage on tmpfs (the path at memory speed)",
            "hugepages": "the host's shmem huge pages on (`shmem_enabled: advise`)",
        },
    ),
    "long_restore": Benchmark(
        "long-restore",
        "A long prompt's KV restored from L2 into an empty L1 through `lmcache server`",
        "bench.long_restore_report:markdown",
        {"tmpfs": "every contender's storage on tmpfs (the path at memory speed)"},
    ),
    "lookup_under_load": Benchmark(
        "lookup",
        "L1-hit lookups while the same LMCache server writes through to L2",
        "bench.lookup_under_load:render",
        {"copy-path": "ours with L1 in private memory (the copy path), not shared memory"},
    ),
    "op_path": Benchmark(
        "op-path",
        "Where a batch's time goes, stage by stage",
        "bench.op_path:report",
        {"tmpfs": "the gateway's database on tmpfs (the path at memory speed)"},
    ),
    "floor": Benchmark("floor", "The disk's floor (fio and a Python probe)", "bench.floor:report"),
    "backlog": Benchmark(
        "backlog",
        "Read-first scheduling under a store backlog",
        "bench.backlog_report:markdown",
        {"one-session": "`--phases one_session`: loads behind the same session's stores"},
    ),
    "clients": Benchmark("clients", "Many clients on one gateway", "bench.clients:markdown"),
    "exists": Benchmark("exists", "EXISTS latency", "bench.exists:table"),
    "restart": Benchmark(
        "restart", "Restart: launch to the first EXISTS hit", "bench.restart:table"
    ),
    "zero_copy": Benchmark(
        "zero-copy", "Zero-copy against the copy path", "bench.zero_copy:markdown"
    ),
    "storage": Benchmark(
        "storage", "Throughput, EXISTS and restart in one run", "bench.storage:markdown"
    ),
    "store_start": Benchmark(
        "store-start",
        "What the start of a store costs inside LMCache's process",
        "bench.store_start:markdown",
    ),
    "ttft_restore": Benchmark(
        "ttft-restore",
        "A returning prompt through vLLM: restored from the gateway against recomputed",
        "bench.ttft_restore:markdown",
    ),
    "ab": Benchmark(
        "ab",
        "An interleaved A/B: this code against the commit before (bench/ab.sh)",
        "bench.ab_report:markdown",
        {
            "matrix": "of `bench/matrix.py` (stores and loads on the disk)",
            "lookup": "of `bench/lookup_under_load.py` (lookups during write-through)",
        },
    ),
    "trace_sim": Benchmark(
        "trace-sim",
        "A production request trace replayed offline: hits and writes per cache policy",
        "bench.trace_sim:markdown",
        {"blocks": "regions of one block: the policies without the card's region granularity"},
    ),
    "trace_bounds": Benchmark(
        "trace-bounds",
        "A production request trace offline: the gateway's constants fitted with hindsight",
        "bench.trace_bounds:markdown",
    ),
    "trace_replay": Benchmark(
        "trace-replay",
        "A production request trace through a real `lmcache server`: L2 hits and drive writes",
        "bench.trace_replay:markdown",
        {"short": "a shorter part of the trace (its first requests: the command says how many)"},
    ),
    "two_adapters": Benchmark(
        "two-adapters",
        "Lookups through LMCache with ours alone and beside a second L2 adapter",
        "bench.two_adapters:markdown",
    ),
}
NAME = re.compile(r"^(?P<name>[a-z0-9-]+)-(?P<machine>[a-z0-9]+)$")
STAMP = ("benchmark", "command", "commit", "date")


@dataclass(frozen=True)
class Result:
    """What a results file's name says: the benchmark, its variant (or ""), the machine."""

    benchmark: Benchmark
    variant: str
    machine: str


def parse_name(stem: str) -> Result:
    """The result a file stem names; ValueError saying what a name must be otherwise."""
    found = NAME.match(stem)
    if found is not None and found["machine"] in MACHINES:
        for benchmark in BENCHMARKS.values():
            name = found["name"]
            if name == benchmark.name:
                return Result(benchmark, "", found["machine"])
            variant = name.removeprefix(benchmark.name + "-")
            if variant != name and variant in benchmark.variants:
                return Result(benchmark, variant, found["machine"])
    names = [
        f"{b.name}[-{'|'.join(b.variants)}]" if b.variants else b.name for b in BENCHMARKS.values()
    ]
    raise ValueError(
        f"{stem!r} is not a result's name: NAME-MACHINE, NAME one of {', '.join(names)} and "
        f"MACHINE one of {', '.join(MACHINES)} (bench/results.py declares them)"
    )


def stamped(benchmark: str, report: dict[str, Any]) -> dict[str, Any]:
    """``report`` with its benchmark, commit and date first (the checkout's commit and the time
    now where the report has none), as every results JSON has them."""
    if benchmark not in BENCHMARKS:
        raise ValueError(f"no benchmark {benchmark!r} in bench/results.py's BENCHMARKS")
    machine = report.get("machine")
    commit = report.get("commit") or (machine.get("commit") if isinstance(machine, dict) else None)
    stamp = {
        "benchmark": benchmark,
        "command": report["command"],
        "commit": commit or commit_of_checkout(),
        "date": report.get("date")
        or _date(report)
        or time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    return stamp | {k: v for k, v in report.items() if k not in stamp}


def _date(report: dict[str, Any]) -> str | None:
    """When the run started, where the benchmark recorded it (always in UTC)."""
    machine = report.get("machine")
    started = report.get("started") or report.get("date_utc")
    if started is None and isinstance(machine, dict):
        started = machine.get("started")
    return f"{started[:16]} UTC" if isinstance(started, str) else None


def write(stem: Path, benchmark: str, report: dict[str, Any]) -> dict[str, Any]:
    """Writes ``stem.json`` (the report, stamped) and ``stem.md``; returns the stamped report.
    The Markdown names the machine when the stem is a result's name (``matrix-vm``); to be
    committed, a file must have one (tests/unit/test_bench_results.py checks)."""
    report = stamped(benchmark, report)
    stem.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{stem}.json").write_text(json.dumps(report, indent=1) + "\n")
    try:
        result: Result | None = parse_name(stem.name)
    except ValueError:
        result = None
    Path(f"{stem}.md").write_text(markdown(report, result))
    return report


def markdown(report: dict[str, Any], result: Result | None) -> str:
    """The header (what ran, on which commit, when, where), then the benchmark's own report;
    ``result``: what the file's name says, None for a file outside the scheme."""
    benchmark = BENCHMARKS[report["benchmark"]]
    lines = [f"# {benchmark.title}", ""]
    if result is not None and result.variant:
        lines.append(f"- variant: {benchmark.variants[result.variant]}")
    lines += [
        f"- command: `{report['command']}`",
        f"- commit: {report['commit']}",
        f"- date: {report['date']}",
        f"- machine: {MACHINES[result.machine] if result else 'not recorded'}",
    ]
    if report.get("note"):
        lines.append(f"- note: {report['note']}")
    body = _report_function(benchmark)(report)
    return "\n".join(lines) + "\n\n" + body + ("" if body.endswith("\n") else "\n")


def _report_function(benchmark: Benchmark) -> Callable[[dict[str, Any]], str]:
    module, function = benchmark.report.split(":")
    found: Callable[[dict[str, Any]], str] = getattr(importlib.import_module(module), function)
    return found


def result_files(directory: Path = RESULTS) -> list[Path]:
    """Every file in ``directory`` but its README, in name order."""
    return sorted(p for p in directory.iterdir() if p.name != INDEX)


def problems(directory: Path = RESULTS) -> list[str]:
    """What is not as the scheme has it: a file or folder that is not a result's JSON or
    Markdown, a JSON without its Markdown (or the reverse), a JSON whose stamp is missing or
    names another benchmark than its name does."""
    found = []
    stems: dict[str, set[str]] = {}
    for path in result_files(directory):
        if path.suffix not in (".json", ".md") or not path.is_file():
            found.append(f"{path.name}: not a result (only NAME-MACHINE.json and .md belong here)")
            continue
        try:
            parse_name(path.stem)
        except ValueError as exc:
            found.append(f"{path.name}: {exc}")
            continue
        stems.setdefault(path.stem, set()).add(path.suffix)
    for stem, suffixes in sorted(stems.items()):
        if suffixes != {".json", ".md"}:
            found.append(f"{stem}: has {sorted(suffixes)}, a result is a .json and its .md")
        elif why := _stamp_problem(stem, json.loads((directory / f"{stem}.json").read_text())):
            found.append(f"{stem}.json: {why}")
    return found


def _stamp_problem(stem: str, report: dict[str, Any]) -> str | None:
    missing = [key for key in STAMP if not report.get(key)]
    if missing:
        return f"no {', '.join(missing)} (bench.results.write stamps them)"
    named = parse_name(stem).benchmark
    if BENCHMARKS.get(report["benchmark"]) is not named:
        return f"its benchmark is {report['benchmark']!r}, its name says {named.name!r}"
    return None


def render_all(directory: Path = RESULTS) -> dict[Path, str]:
    """Each result's Markdown as its JSON renders it, by path (JSON that ``problems`` names
    are left out)."""
    rendered = {}
    for path in result_files(directory):
        if path.suffix != ".json" or not path.is_file():
            continue
        try:
            result = parse_name(path.stem)
        except ValueError:
            continue
        report = json.loads(path.read_text())
        if _stamp_problem(path.stem, report) is None:
            rendered[path.with_suffix(".md")] = markdown(report, result)
    return rendered


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing, report drift")
    parser.add_argument("--dir", type=Path, default=RESULTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    stale = []
    for path, text in render_all(args.dir).items():
        if not path.exists() or path.read_text() != text:
            stale.append(path.name)
            if not args.check:
                path.write_text(text)
    for name in stale:
        print(f"{'out of date' if args.check else 'wrote'}: {name}")
    bad = problems(args.dir)
    for line in bad:
        print(f"bench/results: {line}", file=sys.stderr)
    return 1 if bad or (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
