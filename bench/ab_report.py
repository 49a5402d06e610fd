"""The verdict of an interleaved A/B (bench/ab.sh): each side's median over its rounds, and the
new side's against the base's, for the matrix (MB/s per cell, contender and phase) and the
lookup benchmark (lookup latency percentiles per contender).

    python -m bench.ab_report OUT [--out bench/results/ab-matrix-vm]

OUT is bench/ab.sh's folder: ``base-r1.json``, ``new-r1.json``, ... Within a matrix round each
point is already the median of its repeats; the A/B takes the median of those over the rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.results import write as write_result

SIDES = ("base", "new")
LOOKUP_FIGURES = ("idle_p50_ms", "idle_p99_ms", "busy_p50_ms", "busy_p99_ms")
Figures = dict[str, dict[str, list[float]]]  # what -> side -> one value per round


def rounds(folder: Path) -> dict[str, list[dict[str, Any]]]:
    """Each side's round reports, in round order."""
    found: dict[str, list[dict[str, Any]]] = {}
    for side in SIDES:
        paths = sorted(folder.glob(f"{side}-r*.json"), key=lambda p: int(p.stem.split("-r")[1]))
        found[side] = [json.loads(p.read_text()) for p in paths]
    if not all(found.values()):
        raise SystemExit(f"{folder}: no base-rN.json or new-rN.json (bench/ab.sh writes them)")
    return found


def matrix_figures(reports: dict[str, list[dict[str, Any]]]) -> Figures:
    """MB/s per cell, contender and phase."""
    figures: Figures = defaultdict(lambda: defaultdict(list))
    for side, side_reports in reports.items():
        for report in side_reports:
            for cell in report["cells"]:
                point = cell["load"]
                where = (
                    f"{point['size_kb']} KiB x {point['keys']} keys, {point['in_flight']} in flight"
                )
                for contender, runs in cell["runs"].items():
                    for phase in ("store", "load"):
                        speeds = [run[phase]["MBps"] for run in runs if phase in run]
                        if speeds:
                            what = f"{where}: {contender} {phase} MB/s"
                            figures[what][side].append(statistics.median(speeds))
    return figures


def lookup_figures(reports: dict[str, list[dict[str, Any]]]) -> Figures:
    """Lookup latency percentiles per contender."""
    figures: Figures = defaultdict(lambda: defaultdict(list))
    for side, side_reports in reports.items():
        for report in side_reports:
            for contender, summary in report["summary"].items():
                for name in LOOKUP_FIGURES:
                    if summary.get(name) is not None:
                        figures[f"{contender} {name}"][side].append(summary[name])
    return figures


FIGURES = {"matrix": matrix_figures, "lookup_under_load": lookup_figures}


def started_of(report: dict[str, Any]) -> str | None:
    started = report.get("started") or report.get("machine", {}).get("started")
    return str(started) if started else None


def commit_of(report: dict[str, Any]) -> str:
    """The commit a round ran (an older bench names it only under ``machine``)."""
    return str(report.get("commit") or report["machine"]["commit"])


def compare(folder: Path) -> dict[str, Any]:
    reports = rounds(folder)
    benchmark = reports["new"][0]["benchmark"]
    figures = FIGURES[benchmark](reports)
    rows = []
    for what, sides in figures.items():
        base, new = (statistics.median(sides[s]) if sides[s] else None for s in SIDES)
        rows.append(
            {
                "figure": what,
                "base_rounds": sides["base"],
                "new_rounds": sides["new"],
                "base": base,
                "new": new,
                "new_over_base": new / base if base and new is not None else None,
            }
        )
    return {
        "compared": benchmark,
        "base_commit": commit_of(reports["base"][0]),
        "new_commit": commit_of(reports["new"][0]),
        "rounds": len(reports["new"]),
        # the A/B's start, the result's date (the base's bench may not say; the new one's does)
        "started": started_of(reports["base"][0]) or reports["new"][0].get("date"),
        "base_command": reports["base"][0]["command"],
        "rows": rows,
    }


def markdown(report: dict[str, Any]) -> str:
    """The table of medians (bench/results.py renders the file's header)."""
    lines = [
        f"{report['rounds']} interleaved rounds of `{report['compared']}`, base "
        f"{report['base_commit']} then new {report['new_commit']} in each round "
        "(bench/ab.sh); medians over the rounds, every round's value beside them.",
        "",
        "| figure | base | new | new / base | base rounds | new rounds |",
        "|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        ratio = "" if row["new_over_base"] is None else f"{row['new_over_base']:.2f}"
        lines.append(
            f"| {row['figure']} | {_value(row['base'])} | {_value(row['new'])} | {ratio} | "
            f"{', '.join(map(_value, row['base_rounds']))} | "
            f"{', '.join(map(_value, row['new_rounds']))} |"
        )
    return "\n".join(lines) + "\n"


def _value(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("folder", type=Path, help="bench/ab.sh's OUT")
    parser.add_argument("--out", type=Path, help="write OUT.json and OUT.md")
    parser.add_argument("--command", required=True, help="the bench/ab.sh command that ran")
    args = parser.parse_args(argv)
    report = {"command": args.command, "commit": None} | compare(args.folder)
    report["commit"] = report["new_commit"]
    print(markdown(report))
    if args.out:
        write_result(args.out, "ab", report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
