"""Whether the gateway's policies fall short of a share of Belady's for want of better constants,
and where Belady's hits come from that they cannot reach: two questions bench/trace_sim.py
leaves open.

- **Hindsight.** The gateway's admission (adp_gateway/policy/admission.py) with its bar held at
  one value, in front of the card's scan-resistant ranking (adp_gateway/card/software/victims.py)
  with unread regions aging at one factor, over a grid of both. The grid's best cell is what
  these two constants reach when fitted to the very trace they are judged on. It is not a
  ceiling for the gateway, whose bar moves with the card's pressure (on the production trace
  that beats every fixed bar at 2 % of the distinct blocks), but where ``ours`` is near it, a
  better choice of constants would not close the gap.
- **First reuses.** A reference is a block's first reuse when the block was referenced exactly
  once before. A policy hits it only if it wrote the block when it had been seen once, before
  anything said it would come back; Belady writes only blocks that come back, and of those the
  ones that come back soonest. The report splits each policy's hits into first reuses and later
  ones.

Both run the gateway's own classes, as trace_sim.py does.

    python -m bench.trace_bounds TRACE [--capacities 1,2,10] [--bars 0,0.5,1,...]
        [--factors 1,1.6,...] [--blocks-per-region 4] [--requests N]
        [--out bench/results/trace-bounds-vm]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from adp_gateway.card.software.victims import Ranking
from adp_gateway.policy.admission import AdmissionSettings
from adp_wire.units import parse_size
from bench.machine import machine
from bench.results import write as write_result
from bench.trace_file import Trace, read_trace, source_of
from bench.trace_sim import ours_settings, replay_belady, replay_gateway, summary

CAPACITIES_PERCENT = (1.0, 2.0, 10.0)
# A bar of 1 is second sighting, 2 third; a factor of 1 is LRU, 1.6 the gateway's.
BARS = (0.0, 0.5, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5)
FACTORS = (1.0, 1.6, 2.5, 4.0)


def first_reuses(trace: Trace) -> npt.NDArray[np.bool_]:
    """Per reference: whether it is its block's first reuse (the block referenced once
    before)."""
    order = np.argsort(trace.blocks, kind="stable")
    sorted_blocks = trace.blocks[order]
    starts = np.flatnonzero(np.r_[True, sorted_blocks[1:] != sorted_blocks[:-1]])
    occurrence = np.arange(trace.references) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    is_first_reuse = np.zeros(trace.references, bool)
    is_first_reuse[order[occurrence == 1]] = True
    return is_first_reuse


def gateway_settings(capacity: int, block_bytes: int, bar: float | None) -> AdmissionSettings:
    """The admission trace_sim.py gives ``ours``; with ``bar``, held there."""
    ours = ours_settings(capacity, block_bytes)
    if bar is None:
        return ours
    return dataclasses.replace(ours, bar_floor=bar, pressure_bar_max=bar)


def split(hit: npt.NDArray[np.bool_], is_first_reuse: npt.NDArray[np.bool_]) -> dict[str, int]:
    return {"hits": int(hit.sum()), "first_reuse_hits": int((hit & is_first_reuse).sum())}


def bounds_at(
    trace: Trace,
    percent: float,
    blocks_per_region: int,
    block_bytes: int,
    bars: list[float],
    factors: list[float],
) -> dict[str, Any]:
    """One capacity: Belady's and ours' hits, split, and the grid of fixed bars and factors."""
    capacity = trace.capacity_blocks(percent)
    is_first_reuse = first_reuses(trace)
    belady = np.zeros(trace.references, bool)
    replay_belady(trace, capacity, belady)
    ours = np.zeros(trace.references, bool)
    settings = gateway_settings(capacity, block_bytes, None)
    ours_writes = replay_gateway(
        trace, capacity, blocks_per_region, Ranking.SCAN_RESISTANT, settings, block_bytes, hit=ours
    )[1]
    grid = []
    for factor in factors:
        for bar in bars:
            hits, writes = replay_gateway(
                trace,
                capacity,
                blocks_per_region,
                Ranking.SCAN_RESISTANT,
                gateway_settings(capacity, block_bytes, bar),
                block_bytes,
                unread_age_factor=factor,
            )
            grid.append(
                {"bar": bar, "unread_age_factor": factor, "hits": hits, "blocks_written": writes}
            )
    later = int((~is_first_reuse).sum()) - trace.distinct  # a block's third reference or later
    return {
        "capacity_percent": percent,
        "capacity_blocks": capacity,
        "first_reuses": int(is_first_reuse.sum()),
        "later_reuses": later,
        "belady": split(belady, is_first_reuse),
        "ours": split(ours, is_first_reuse) | {"blocks_written": ours_writes},
        "grid": grid,
    }


def markdown(report: dict[str, Any]) -> str:
    """The best fixed cell against ours and Belady, the hits split, and each grid (bench/
    results.py renders the file's header)."""
    trace = report["trace_summary"]
    references = trace["references"]

    def pct(hits: int) -> str:
        return f"{100 * hits / max(references, 1):.2f}"

    lines = [
        f"Trace {report['trace']}{source_of(report['trace'])}: {trace['requests']} requests, "
        f"{references} block references, {trace['distinct']} distinct blocks over "
        f"{trace['duration_s']:.0f} s. Regions of {report['blocks_per_region']} block(s).",
        "",
        "The gateway's admission with its bar fixed, in front of the scan-resistant ranking with "
        "its unread regions' aging fixed, the pair chosen with hindsight as the one that hits "
        "the most at each capacity (the grid's best cell); hit ratio over block references, % "
        "(and % of Belady's):",
        "",
        "| capacity | Belady | ours | best fixed pair | bar, aging |",
        "|---|---|---|---|---|",
    ]
    for row in report["capacities"]:
        belady = row["belady"]["hits"]
        best = max(row["grid"], key=lambda cell: cell["hits"])

        def share(hits: int, belady: int = belady) -> str:
            return f"{pct(hits)} ({100 * hits / max(belady, 1):.0f})"

        lines.append(
            f"| {row['capacity_percent']:g} % | {pct(belady)} | {share(row['ours']['hits'])} "
            f"| {share(best['hits'])} | {best['bar']:g}, {best['unread_age_factor']:g} |"
        )
    lines += [
        "",
        "Where the hits come from: a block's first reuse (its second reference) against its "
        "later ones, in references:",
        "",
        "| capacity | first reuses | hit by Belady | hit by ours | later reuses | hit by Belady "
        "| hit by ours |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in report["capacities"]:
        b, o = row["belady"], row["ours"]
        lines.append(
            f"| {row['capacity_percent']:g} % | {row['first_reuses']} | {b['first_reuse_hits']} "
            f"| {o['first_reuse_hits']} | {row['later_reuses']} "
            f"| {b['hits'] - b['first_reuse_hits']} | {o['hits'] - o['first_reuse_hits']} |"
        )
    for row in report["capacities"]:
        factors = list(dict.fromkeys(cell["unread_age_factor"] for cell in row["grid"]))
        by = {(c["bar"], c["unread_age_factor"]): c["hits"] for c in row["grid"]}
        lines += [
            "",
            f"At {row['capacity_percent']:g} %, hit ratio % by bar (rows) and unread aging "
            "(columns):",
            "",
            "| bar | " + " | ".join(f"{f:g}" for f in factors) + " |",
            "|---|" + "---|" * len(factors),
        ]
        for bar in dict.fromkeys(cell["bar"] for cell in row["grid"]):
            lines.append(f"| {bar:g} | " + " | ".join(pct(by[bar, f]) for f in factors) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("trace", type=Path, help="a trace in the Mooncake format (JSON lines)")
    parser.add_argument("--capacities", default=",".join(f"{c:g}" for c in CAPACITIES_PERCENT))
    parser.add_argument("--bars", default=",".join(f"{b:g}" for b in BARS))
    parser.add_argument("--factors", default=",".join(f"{f:g}" for f in FACTORS))
    parser.add_argument("--blocks-per-region", type=int, default=4)
    parser.add_argument("--block-bytes", default="64MiB", help="KV bytes per trace block")
    parser.add_argument("--requests", type=int, help="only the first N requests")
    parser.add_argument(
        "--out", type=Path, help="write OUT.json and OUT.md (bench/results/trace-bounds-vm)"
    )
    args = parser.parse_args(argv)
    trace = read_trace(args.trace)
    if args.requests:
        trace = trace.head(min(args.requests, trace.requests))
    block_bytes = parse_size(args.block_bytes, "--block-bytes")
    where = machine(Path("."))  # before the run: the code it ran
    rows = []
    for percent in (float(c) for c in args.capacities.split(",")):
        started = time.monotonic()
        rows.append(
            bounds_at(
                trace,
                percent,
                args.blocks_per_region,
                block_bytes,
                [float(b) for b in args.bars.split(",")],
                [float(f) for f in args.factors.split(",")],
            )
        )
        print(f"{percent:g} %: {time.monotonic() - started:.0f} s", flush=True)
    data = {
        "command": "python -m bench.trace_bounds " + " ".join(argv or sys.argv[1:]),
        "machine": where,
        "trace": args.trace.name,
        "trace_summary": summary(trace),
        "blocks_per_region": args.blocks_per_region,
        "block_bytes": block_bytes,
        "capacities": rows,
    }
    data = json.loads(json.dumps(data, default=str))  # the machine's fields, as text
    print(markdown(data))
    if args.out:
        write_result(args.out, "trace_bounds", data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
