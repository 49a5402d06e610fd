"""Offline replay of a request trace against cache policies, in seconds rather than hours: what
each policy would hit and write at each capacity, before the real stack is run
(bench/trace_replay.py).

The rule is LMCache's: a request uses its blocks up to its first miss (a prefix); every block
from there on is recomputed and stored (a store of a block held already writes nothing). Hit
ratio is over block references. Capacities are shares of the trace's distinct blocks.

Policies:

- ``lru``: blocks, least recently used evicted, every store written (the reference the issue
  quotes: LRU 7.9 % at 2 % of Mooncake's conversation trace). A held block that a request
  stores again, past its first miss, counts as used, as the issue's figures have it; the
  gateway's card does not touch it (such a store writes nothing), which moved ``ours`` by 0.06
  points at most when weighed;
- ``belady``: blocks, Belady's MIN with bypass: the block used furthest in the future is
  evicted, and a block whose next use is further than every held one's is not written (32.1 %
  at 2 %). The issue's reference; under the prefix rule it is not a strict bound, as it may
  keep a block whose next use comes after a miss in its request and cannot hit;
- ``second-sighting``: ``lru`` that writes a block only when it has been seen before, with an
  unbounded record (14.2 % at 2 %, a quarter of LRU's writes);
- ``oracle-lru``: ``lru`` that writes only blocks the trace references again: the most any
  admission can get in front of LRU;
- ``top-frequency``: the blocks the trace references most, as many as the capacity holds, each
  written at its first reference and never evicted, and nothing else: the most a cache that
  judges blocks by how often they are used can get;
- the gateway's own policies, run as the gateway runs them: the admission of
  ``adp_gateway/policy/admission.py`` (the same class) in front of a log of regions of
  ``--blocks-per-region`` blocks, evicted whole in the order
  ``adp_gateway/card/software/victims.py`` ranks them (the same class). ``region-lru``
  writes everything and evicts by LRU (the gateway before admission existed); ``ours`` is the
  gateway's default (admission under pressure, scan-resistant eviction); ``ours-lru`` the same
  admission with LRU eviction; ``gateway-ss`` the gateway's admission held at second sighting
  (its bounded record); ``prefix-aware`` is ``ours`` told, from the trace, which of the 64
  least recently used regions hold only blocks whose prefix is gone (worth nothing: no request
  can reach them), and evicting one of those first (an oracle: the gateway cannot tell a key's
  prefix); ``ours-lfu`` is ``ours`` with a frequency-aware eviction, weighed and not taken
  (``FrequencyAwareOrder``);
- ``ours-budget``: ``ours`` with a write budget of ``--budget-share`` of ``region-lru``'s write
  rate at that capacity, in a bucket of ``--burst-s`` seconds of it (5 % of the trace's time).

    python -m bench.trace_sim TRACE [--capacities 1,2,5,10,25,50] [--policies lru,belady,...]
        [--blocks-per-region 1] [--block-bytes 64MiB] [--requests N] [--budget-share 0.25]
        [--burst-s S] [--out bench/results/trace-sim-vm]
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import itertools
import json
import sys
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from sortedcontainers import SortedList

from adp_gateway.card.software.eviction_ages import EvictionAges
from adp_gateway.card.software.victims import UNREAD_AGE_FACTOR, EvictionOrder, Rank, Ranking
from adp_gateway.policy.admission import Admission, AdmissionSettings
from adp_wire.presence import fingerprint
from adp_wire.units import format_size, parse_size
from bench.machine import machine
from bench.results import write as write_result
from bench.trace_file import Trace, read_trace, source_of

CAPACITIES_PERCENT = (1.0, 2.0, 5.0, 10.0, 25.0, 50.0)
POLICIES = (
    "lru",
    "belady",
    "oracle-lru",
    "top-frequency",
    "second-sighting",
    "region-lru",
    "ours",
    "ours-lru",
    "gateway-ss",
    "prefix-aware",
    "ours-lfu",
    "ours-budget",
)
# ours-budget's bucket, as a share of the trace's time: the written rate over the run can exceed
# the budget by the bucket it started with, so a bucket of 5 % keeps it within 10 %.
BURST_SHARE = 0.05
Indices = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class Outcome:
    policy: str
    capacity_percent: float
    capacity_blocks: int
    hits: int
    references: int
    blocks_written: int
    bytes_written: int
    write_budget_bytes_per_s: float | None = None
    seconds: float = 0.0

    @property
    def hit_ratio(self) -> float:
        return self.hits / max(self.references, 1)


def replay_lru(
    trace: Trace, capacity: int, admit_seen_only: bool = False, oracle: bool = False
) -> tuple[int, int]:
    """Block LRU: hits and writes. ``admit_seen_only``: a block is written only once seen
    before; ``oracle``: only if it will be referenced again (what no online admission can beat
    in front of LRU)."""
    cache: OrderedDict[int, None] = OrderedDict()
    seen: set[int] = set()
    left = Counter(trace.blocks.tolist()) if oracle else Counter()
    hits = writes = 0
    for i in range(trace.requests):
        prefix = True
        for block in trace.request(i):
            if oracle:
                left[block] -= 1
            held = block in cache
            if prefix and held:
                hits += 1
                cache.move_to_end(block)
            else:
                prefix = False
                if held:
                    cache.move_to_end(block)
                elif (not admit_seen_only or block in seen) and (not oracle or left[block] > 0):
                    cache[block] = None
                    writes += 1
                    if len(cache) > capacity:
                        cache.popitem(last=False)
            seen.add(block)
    return hits, writes


def replay_top_frequency(trace: Trace, capacity: int) -> tuple[int, int]:
    """The ``capacity`` blocks referenced most (the earlier first on a tie), held from their
    first reference on: hits and writes."""
    blocks, first, counts = np.unique(trace.blocks, return_index=True, return_counts=True)
    chosen = set(blocks[np.lexsort((first, -counts))[:capacity]].tolist())
    held: set[int] = set()
    hits = 0
    for i in range(trace.requests):
        prefix = True
        for block in trace.request(i):
            if prefix and block in held:
                hits += 1
            else:
                prefix = False
                if block in chosen:
                    held.add(block)
    return hits, len(held)


def replay_belady(trace: Trace, capacity: int, hit: Mask | None = None) -> tuple[int, int]:
    """Optimal offline (Belady, with bypass): hits and writes. ``hit``, if given (one entry per
    reference), is set where a reference hits."""
    never = trace.references + 1
    next_use = np.full(trace.references, never, np.int64)
    last: dict[int, int] = {}
    for position in range(trace.references - 1, -1, -1):
        block = int(trace.blocks[position])
        next_use[position] = last.get(block, never)
        last[block] = position
    held: dict[int, int] = {}  # block -> its next use
    furthest: list[tuple[int, int]] = []  # (-next use, block), stale entries skipped
    hits = writes = position = 0
    for i in range(trace.requests):
        prefix = True
        for block in trace.request(i):
            upcoming = int(next_use[position])
            position += 1
            if block in held:
                hits += prefix
                if hit is not None:
                    hit[position - 1] = prefix
                held[block] = upcoming
                heapq.heappush(furthest, (-upcoming, block))
                continue
            prefix = False
            if upcoming == never:
                continue
            if len(held) >= capacity:
                while held.get(furthest[0][1]) != -furthest[0][0]:
                    heapq.heappop(furthest)
                if -furthest[0][0] <= upcoming:
                    continue  # everything held is used sooner: not written
                del held[heapq.heappop(furthest)[1]]
            held[block] = upcoming
            heapq.heappush(furthest, (-upcoming, block))
            writes += 1
    return hits, writes


READ_AGAIN_SLOWER = 1.6  # FrequencyAwareOrder: how much slower a region read twice ages


class FrequencyAwareOrder:
    """``ours-lfu``'s ranking, weighed against the gateway's and not taken: scan-resistant's
    (victims.py), where a region read more than once also ages ``READ_AGAIN_SLOWER`` times as
    slowly as one read once. Kept as ``EvictionOrder`` keeps its lists: one per class of reads,
    each by last use, whose heads compete. On the production trace it hit less than the
    scan-resistant ranking at most capacities (trace-sim-vm): reuse there is of recency (a
    conversation's next turn), not of a few hot blocks."""

    _AGING = (UNREAD_AGE_FACTOR, 1.0, 1 / READ_AGAIN_SLOWER)  # read 0, 1, 2 or more times

    def __init__(self) -> None:
        self._by_reads = [SortedList[tuple[int, int]]() for _ in self._AGING]

    def __len__(self) -> int:
        return sum(map(len, self._by_reads))

    def add(self, region: SimRegion) -> None:
        self._list(region).add((region.last_access, region.index))

    def remove(self, region: SimRegion) -> None:
        self._list(region).remove((region.last_access, region.index))

    def least_recently_used(self, count: int) -> list[int]:
        return [index for _, index in itertools.islice(heapq.merge(*self._by_reads), count)]

    def victim(
        self, ranking: Ranking, may_take: Callable[[int], bool], now: int
    ) -> tuple[Rank, int] | None:
        heads = [
            (-rate * (now - clock), index)
            for rate, ranked in zip(self._AGING, self._by_reads, strict=True)
            for clock, index in itertools.islice(filter(lambda e: may_take(e[1]), ranked), 1)
        ]
        return min(heads, default=None)

    def _list(self, region: SimRegion) -> SortedList[tuple[int, int]]:
        return self._by_reads[min(region.reads, len(self._AGING) - 1)]


@dataclass
class SimRegion:
    """A region as the ranking reads it (victims.Ranked), and the blocks it holds."""

    index: int
    last_access: int = 0
    reads: int = 0
    last_access_s: float = 0.0
    members: list[int] = dataclasses.field(default_factory=list)


def region_count(capacity_blocks: int, blocks_per_region: int) -> int:
    """The regions a card of ``capacity_blocks`` has (two at least: one open, one to evict)."""
    return max(2, -(-capacity_blocks // blocks_per_region))


class RegionCache:
    """The software card as the policies see it: regions of ``blocks_per_region`` blocks
    filled in order, one open at a time, reclaimed whole in the order the card's
    ``EvictionOrder`` ranks them (or a ``FrequencyAwareOrder``, weighed against it);
    ``EvictionAges`` hears each reclaim as the card's does."""

    def __init__(
        self,
        capacity: int,
        blocks_per_region: int,
        ranking: Ranking,
        frequency_aware: bool,
        unread_age_factor: float = UNREAD_AGE_FACTOR,
    ) -> None:
        count = region_count(capacity, blocks_per_region)
        self.per_region = blocks_per_region
        self.ranking = ranking
        self.regions = [SimRegion(i) for i in range(count)]
        self.free = list(range(count - 1, -1, -1))  # taken from the end: region 0 first
        self.order = FrequencyAwareOrder() if frequency_aware else EvictionOrder(unread_age_factor)
        self.where: dict[int, int] = {}
        self.ages = EvictionAges()
        self.clock = 0
        self.open = -1
        self.prefer: Callable[[Indices], Mask] | None = None  # prefix-aware's oracle

    def read(self, index: int, now_s: float) -> None:
        region = self.regions[index]
        self.order.remove(region)
        self.clock += 1
        region.last_access = self.clock
        region.last_access_s = now_s
        region.reads += 1
        self.order.add(region)

    def write(self, block: int, now_s: float) -> None:
        if self.open < 0 or len(self.regions[self.open].members) >= self.per_region:
            self._take(now_s)
        self.regions[self.open].members.append(block)
        self.where[block] = self.open

    def _take(self, now_s: float) -> None:
        if self.free:
            region = self.regions[self.free.pop()]
        else:
            region = self.regions[self._victim()]
            self.ages.evicted(now_s - region.last_access_s, now_s)
            for block in region.members:
                del self.where[block]
            self.order.remove(region)
        self.clock += 1
        region.members = []
        region.last_access = self.clock
        region.last_access_s = now_s
        region.reads = 0
        self.order.add(region)
        self.open = region.index

    def _victim(self) -> int:
        def sealed(index: int) -> bool:
            return index != self.open

        may_take: Callable[[int], bool] = sealed
        if self.prefer is not None:  # among the 64 least recently used, only dead ones
            oldest = np.array(
                [i for i in self.order.least_recently_used(65) if sealed(i)][:64], np.int64
            )
            dead = set(oldest[self.prefer(oldest)].tolist())
            if dead:
                may_take = dead.__contains__
        found = self.order.victim(self.ranking, may_take, self.clock)
        assert found is not None, "a full cache has a sealed region"
        return found[1]


def replay_gateway(
    trace: Trace,
    capacity: int,
    blocks_per_region: int,
    ranking: Ranking,
    settings: AdmissionSettings,
    block_bytes: int,
    prefix_aware: bool = False,
    frequency_aware: bool = False,
    unread_age_factor: float = UNREAD_AGE_FACTOR,
    hit: Mask | None = None,
) -> tuple[int, int]:
    """The gateway's admission and eviction over a region log: hits and writes. Requests that
    share a timestamp come evenly spread over its step (``Trace.spread``). ``hit``, if given
    (one entry per reference), is set where a reference hits."""
    trace = trace.spread()
    cache = RegionCache(capacity, blocks_per_region, ranking, frequency_aware, unread_age_factor)
    admission = Admission(settings, float(trace.times_s[0]) if trace.requests else 0.0)
    prints = _fingerprints(trace)
    if prefix_aware:
        cache.prefer = _dead_regions(trace, cache)
    hits = writes = 0
    positions = itertools.count()
    for i in range(trace.requests):
        now_s = float(trace.times_s[i])
        prefix = True
        for block in trace.request(i):
            position = next(positions)
            region = cache.where.get(block)
            if prefix and region is not None:
                hits += 1
                if hit is not None:
                    hit[position] = True
                cache.read(region, now_s)
                admission.sighted(prints[block], now_s)
                continue
            prefix = False
            age = cache.ages.eviction_age_s(now_s)
            held = region is not None
            if admission.admit(prints[block], block_bytes, now_s, age, held) and not held:
                cache.write(block, now_s)
                writes += 1
    return hits, writes


def _fingerprints(trace: Trace) -> dict[int, int]:
    """Each block's key fingerprint, as the gateway takes it from the key's name."""
    return {int(b): fingerprint(f"block-{b}") for b in np.unique(trace.blocks)}


def _dead_regions(trace: Trace, cache: RegionCache) -> Callable[[Indices], Mask]:
    """The oracle of ``prefix-aware``: which of these regions hold only blocks that no request
    can reach, because a block before them in their request (their prefix) is gone."""
    parent: dict[int, int] = {}
    for i in range(trace.requests):
        blocks = trace.request(i)
        for before, block in itertools.pairwise(blocks):
            parent.setdefault(block, before)

    def reachable(block: int) -> bool:
        for _ in range(trace.references):  # a chain is never longer than the trace
            above = parent.get(block)
            if above is None:
                return True
            if above not in cache.where:
                return False
            block = above
        return True

    def dead(regions: Indices) -> Mask:
        return np.array(
            [not any(map(reachable, cache.regions[int(r)].members)) for r in regions], dtype=bool
        )

    return dead


def ours_settings(capacity: int, block_bytes: int) -> AdmissionSettings:
    """``ours``' admission, sized as the gateway sizes it (admission.settings_for): a record of
    eight keys per object the card holds, and its capacity."""
    return AdmissionSettings(record_keys=8 * capacity, capacity_bytes=capacity * block_bytes)


def run_policy(
    policy: str,
    trace: Trace,
    percent: float,
    blocks_per_region: int,
    block_bytes: int,
    budget_share: float,
    burst_s: float,
    write_everything_bytes: int | None = None,
) -> Outcome:
    capacity = trace.capacity_blocks(percent)
    started = time.monotonic()
    budget: float | None = None
    on = ours_settings(capacity, block_bytes)
    second_sighting = dataclasses.replace(on, bar_floor=1.0, pressure_bar_max=1.0)
    gateway = {
        "region-lru": (Ranking.LRU, AdmissionSettings(enabled=False)),
        "ours": (Ranking.SCAN_RESISTANT, on),
        "ours-lru": (Ranking.LRU, on),
        "gateway-ss": (Ranking.LRU, second_sighting),
        "prefix-aware": (Ranking.SCAN_RESISTANT, on),
        "ours-lfu": (Ranking.SCAN_RESISTANT, on),
    }
    if policy == "lru":
        hits, writes = replay_lru(trace, capacity)
    elif policy == "belady":
        hits, writes = replay_belady(trace, capacity)
    elif policy == "second-sighting":
        hits, writes = replay_lru(trace, capacity, admit_seen_only=True)
    elif policy == "oracle-lru":
        hits, writes = replay_lru(trace, capacity, oracle=True)
    elif policy == "top-frequency":
        hits, writes = replay_top_frequency(trace, capacity)
    elif policy == "ours-budget":
        assert write_everything_bytes is not None
        budget = budget_share * write_everything_bytes / max(trace.duration_s, 1e-9)
        settings = dataclasses.replace(on, write_budget_bytes_per_s=budget, burst_s=burst_s)
        hits, writes = replay_gateway(
            trace, capacity, blocks_per_region, Ranking.SCAN_RESISTANT, settings, block_bytes
        )
    else:
        ranking, settings = gateway[policy]
        hits, writes = replay_gateway(
            trace,
            capacity,
            blocks_per_region,
            ranking,
            settings,
            block_bytes,
            prefix_aware=policy == "prefix-aware",
            frequency_aware=policy == "ours-lfu",
        )
    return Outcome(
        policy,
        percent,
        capacity,
        hits,
        trace.references,
        writes,
        writes * block_bytes,
        budget,
        round(time.monotonic() - started, 2),
    )


def simulate(
    trace: Trace,
    policies: list[str],
    capacities: list[float],
    blocks_per_region: int,
    block_bytes: int,
    budget_share: float = 0.25,
    burst_s: float = 60.0,
    progress: Callable[[Outcome], None] = lambda outcome: None,
) -> Iterator[Outcome]:
    for percent in capacities:
        write_everything: int | None = None
        for policy in policies:
            if policy == "ours-budget" and write_everything is None:
                reference = run_policy(
                    "region-lru", trace, percent, blocks_per_region, block_bytes, 0, 0
                )
                write_everything = reference.bytes_written
            outcome = run_policy(
                policy,
                trace,
                percent,
                blocks_per_region,
                block_bytes,
                budget_share,
                burst_s,
                write_everything,
            )
            if policy == "region-lru":
                write_everything = outcome.bytes_written
            progress(outcome)
            yield outcome


def summary(trace: Trace) -> dict[str, float]:
    """What the report says of the trace itself."""
    return {
        "requests": trace.requests,
        "references": trace.references,
        "distinct": trace.distinct,
        "duration_s": trace.duration_s,
        "infinite_hit_ratio": trace.infinite_hit_ratio(),
    }


def markdown(report: dict[str, Any]) -> str:
    """Per capacity, each policy's hit ratio, its share of Belady's, and writes
    (bench/results.py renders the file's header)."""
    outcomes = [
        Outcome(**{k: v for k, v in o.items() if k != "hit_ratio"}) for o in report["outcomes"]
    ]
    trace = report["trace_summary"]
    policies = list(dict.fromkeys(o.policy for o in outcomes))
    by = {(o.policy, o.capacity_percent): o for o in outcomes}
    lines = [
        f"Trace {report['trace']}{source_of(report['trace'])}: {trace['requests']} requests, "
        f"{trace['references']} block references, {trace['distinct']} distinct blocks over "
        f"{trace['duration_s']:.0f} s; a cache that never evicts hits "
        f"{100 * trace['infinite_hit_ratio']:.1f} %. Regions of {report['blocks_per_region']} "
        f"block(s); {format_size(report['block_bytes'])} per block"
        + (
            f"; ours-budget: a budget of {report['budget_share']:g} of region-lru's write rate, "
            f"a bucket of {report['burst_s']:g} s of it."
            if "ours-budget" in policies
            else "."
        ),
        "",
        "Hit ratio over block references, %"
        + (" (and % of Belady's):" if "belady" in policies else ":"),
        "",
        "| capacity | " + " | ".join(policies) + " |",
        "|---|" + "---|" * len(policies),
    ]
    for percent in dict.fromkeys(o.capacity_percent for o in outcomes):
        belady = by.get(("belady", percent))
        cells = []
        for policy in policies:
            o = by.get((policy, percent))
            if o is None:
                cells.append("")
                continue
            share = f" ({100 * o.hits / belady.hits:.0f})" if belady and belady.hits else ""
            cells.append(f"{100 * o.hit_ratio:.2f}{share}")
        lines.append(f"| {percent:g} % | " + " | ".join(cells) + " |")
    lines += ["", "Blocks written:", "", "| capacity | " + " | ".join(policies) + " |"]
    lines.append("|---|" + "---|" * len(policies))
    for percent in dict.fromkeys(o.capacity_percent for o in outcomes):
        row = [by.get((p, percent)) for p in policies]
        cells = [str(o.blocks_written) if o else "" for o in row]
        lines.append(f"| {percent:g} % | " + " | ".join(cells) + " |")
    budgeted = [o for o in outcomes if o.write_budget_bytes_per_s]
    if budgeted:
        lines += ["", "ours-budget against its budget:", ""]
        lines += ["| capacity | budget | written rate | of budget |", "|---|---|---|---|"]
        for o in budgeted:
            assert o.write_budget_bytes_per_s is not None
            rate = o.bytes_written / max(trace["duration_s"], 1e-9)
            lines.append(
                f"| {o.capacity_percent:g} % | {format_size(int(o.write_budget_bytes_per_s))}/s "
                f"| {format_size(int(rate))}/s | {rate / o.write_budget_bytes_per_s:.3f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("trace", type=Path, help="a trace in the Mooncake format (JSON lines)")
    parser.add_argument("--capacities", default=",".join(f"{c:g}" for c in CAPACITIES_PERCENT))
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--blocks-per-region", type=int, default=1)
    parser.add_argument("--block-bytes", default="64MiB", help="KV bytes per trace block")
    parser.add_argument("--requests", type=int, help="only the first N requests")
    parser.add_argument("--budget-share", type=float, default=0.25)
    parser.add_argument(
        "--burst-s", type=float, help="the budget's bucket; default: 5 %% of the trace's time"
    )
    parser.add_argument(
        "--out", type=Path, help="write OUT.json and OUT.md (bench/results/trace-sim-vm)"
    )
    args = parser.parse_args(argv)
    unknown = set(args.policies.split(",")) - set(POLICIES)
    if unknown:
        parser.error(f"unknown policies {sorted(unknown)}; choose from {', '.join(POLICIES)}")
    trace = read_trace(args.trace)
    if args.requests:
        trace = trace.head(min(args.requests, trace.requests))
    block_bytes = parse_size(args.block_bytes, "--block-bytes")
    burst_s = args.burst_s or BURST_SHARE * trace.duration_s
    capacities = [float(c) for c in args.capacities.split(",")]

    def show(o: Outcome) -> None:
        print(
            f"{o.capacity_percent:g}% {o.policy}: {100 * o.hit_ratio:.2f} % hit, "
            f"{o.blocks_written} blocks written ({o.seconds} s)",
            flush=True,
        )

    where = machine(Path("."))  # before the run: the code it ran
    outcomes = list(
        simulate(
            trace,
            args.policies.split(","),
            capacities,
            args.blocks_per_region,
            block_bytes,
            args.budget_share,
            burst_s,
            show,
        )
    )
    data = {
        "command": "python -m bench.trace_sim " + " ".join(argv or sys.argv[1:]),
        "machine": where,
        "trace": args.trace.name,
        "trace_summary": summary(trace),
        "blocks_per_region": args.blocks_per_region,
        "block_bytes": block_bytes,
        "budget_share": args.budget_share,
        "burst_s": burst_s,
        "outcomes": [asdict(o) | {"hit_ratio": o.hit_ratio} for o in outcomes],
    }
    data = json.loads(json.dumps(data, default=str))  # the machine's fields, as text
    print(markdown(data))
    if args.out:
        write_result(args.out, "trace_sim", data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
