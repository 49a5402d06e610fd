"""A request trace replayed through a real ``lmcache server`` and its L2, at capacities that are
shares of the trace's distinct blocks: what each L2 hits and what it writes to the drive.

    python -m bench.trace_replay TRACE [--requests N] [--speed 4] [--block-tokens 16]
        [--capacities 1,2,5,10,25,50] [--contenders ours,gateway-lru,ours-budget,lmcache-lru,
        fs_native] [--l1-gb 0.25] [--blocks-per-region 4] [--budget-share 0.25] [--jobs 1]
        [--out bench/results/trace-replay-vm]

Per request the client (bench/trace_client.py) does what vLLM does through LMCache: LOOKUP of
the prompt's chunks (L1, then the L2 prefix, prefetched), RETRIEVE of the prefix that hit, STORE
of the prompt (the server keeps what it lacks and writes it through to L2). One trace block is
one LMCache chunk of ``--block-tokens`` tokens at 4 KiB per token (16 tokens: 64 KiB per block).
Requests are sent at their trace times divided by ``--speed``; one at a time, so a request late
behind its time goes as soon as the one before it is done (the run reports the latest one).
The server runs with ``--l2-store-policy skip_l1``: L1 (``--l1-gb``) keeps a store only until
L2 has it, so every later hit is L2's (L1 still holds the stores L2 has yet to take, and a
smaller L1 drops stores when L2 falls behind).

Contenders, each from empty storage, one server (and gateway) per capacity:

- ``ours``: the gateway's defaults (admission under pressure, scan-resistant eviction), no write
  budget;
- ``gateway-lru``: the gateway writing every store and evicting by LRU (before issue 44);
- ``ours-budget``: ``ours`` with a write budget of ``--budget-share`` (a quarter) of what
  ``gateway-lru`` wrote per second at that capacity, in a bucket of 5 % of the replay's time
  (the rate over the run may exceed the budget by the bucket it starts with);
- ``lmcache-lru``: LMCache's ``fs_native`` (O_DIRECT) with ``max_capacity_gb`` at the capacity
  and LMCache's own LRU eviction (watermark 0.95, evicting 5 % at a time);
- ``fs_native``: LMCache's ``fs_native`` as shipped, without eviction (the disk fills): run once,
  whatever the capacity.

Reported per capacity: the L2 hit ratio over block references (chunks the server found in L2, as
its ``lookup_hit_l2`` counter says), all hits (L1 too), bytes written to and read from the drive
by the process doing the I/O (``/proc/PID/io``, from when it was ready), and the same capacity's
offline LRU, Belady and second sighting (bench/trace_sim.py). The gateway's stores are written
as one fragment per block, in regions of ``--blocks-per-region`` blocks.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import sys
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from adp_wire.units import format_size
from bench.harness import LMCACHE_BIN
from bench.machine import machine
from bench.results import write as write_result
from bench.trace_client import PAGE_TOKENS, ReplayClient, chunk_bytes
from bench.trace_file import Trace, read_trace, source_of
from bench.trace_sim import (
    BURST_SHARE,
    CAPACITIES_PERCENT,
    region_count,
    run_policy,
    summary,
)
from tests.support import (
    Gateway,
    LMCacheServer,
    free_port,
    remove_tree,
    short_tmpdir,
    wait_until,
)

CONTENDERS = ("ours", "gateway-lru", "ours-budget", "lmcache-lru", "fs_native")
HEADER_BYTES = 4096  # a record's header on the card
SETTLE_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Setup:
    trace: Trace
    trace_name: str
    speed: float
    block_tokens: int
    l1_gb: float
    blocks_per_region: int
    budget_share: float
    timeout_s: float = 120.0
    log: Callable[[str], None] = print

    @property
    def block_bytes(self) -> int:
        return chunk_bytes(self.block_tokens)


@dataclass
class Run:
    contender: str
    capacity_percent: float | None  # None: no capacity (fs_native)
    capacity_bytes: int
    references: int
    hits: int = 0  # chunks the client was told hit (L1 and L2)
    l1_hit_blocks: int = 0
    l2_hit_blocks: int = 0
    drive_written_bytes: int = 0
    drive_read_bytes: int = 0
    seconds: float = 0.0
    late_s: float = 0.0  # how far behind its trace time a request went, at most
    failed_requests: int = 0
    write_budget_bytes_per_s: float | None = None
    gateway: dict[str, Any] = field(default_factory=dict)  # its status: admission, evictions

    @property
    def l2_hit_ratio(self) -> float:
        return self.l2_hit_blocks / max(self.references, 1)

    @property
    def hit_ratio(self) -> float:
        return self.hits / max(self.references, 1)


def process_io(pid: int) -> tuple[int, int]:
    """Bytes the process group led by ``pid`` sent to and fetched from storage."""
    written = read = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getpgid(int(entry)) != pid:
                continue
            fields = dict(
                line.split(": ") for line in Path(f"/proc/{entry}/io").read_text().splitlines()
            )
        except (OSError, ValueError):
            continue  # gone, or not ours to read
        written += int(fields["write_bytes"]) - int(fields["cancelled_write_bytes"])
        read += int(fields["read_bytes"])
    return written, read


def counter_total(port: int, name: str) -> float:
    """The Prometheus counter ``name`` on the ``/metrics`` at ``port``, summed over its labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(float(v) for v in re.findall(rf"^{name}\{{[^}}]*\}} (\S+)$", text, re.M))


def lmcache_hits(server: LMCacheServer) -> dict[str, float]:
    """Tokens the server's lookups found in L1 and in L2 so far."""
    return {
        tier: counter_total(server.http_port, f"lmcache_mp_lookup_hit_{tier}_tokens_total")
        for tier in ("l1", "l2")
    }


def gateway_config(
    setup: Setup, capacity_blocks: int, policy: dict[str, Any], metrics_port: int
) -> str:
    """The gateway's YAML: regions of ``blocks_per_region`` blocks, each block one fragment,
    as many regions as the capacity's blocks fill, the gateway at the model server's CPU
    priority (this bench measures hits and bytes, not lookup latency)."""
    per_region = setup.blocks_per_region
    region = per_region * (setup.block_bytes + HEADER_BYTES) + 4 * HEADER_BYTES
    region = -(-(region + per_region * 512) // 4096) * 4096  # the footer's entries
    regions = region_count(capacity_blocks, per_region)
    settings = {
        "capacity": 4096 + regions * region,
        "region_size": region,
        "fragment_size": setup.block_bytes,
        "prepare_databases": False,
        "cpu_nice": 0,
        "metrics_address": f"127.0.0.1:{metrics_port}",
        **policy,
    }
    return "\n".join(f"{k}: {json.dumps(v)}" for k, v in settings.items()) + "\n"


def replay(setup: Setup, server: LMCacheServer, run: Run) -> None:
    """Send every request at its time (``--speed`` times faster); count hits and failures."""
    trace = setup.trace
    blocks_max = int(max(trace.starts[1:] - trace.starts[:-1], default=1))
    client = ReplayClient(f"tcp://localhost:{server.port}", blocks_max, setup.timeout_s)
    try:
        started = time.monotonic()
        first = float(trace.times_s[0])
        for i in range(trace.requests):
            due = started + (float(trace.times_s[i]) - first) / setup.speed
            if (wait := due - time.monotonic()) > 0:
                time.sleep(wait)
            run.late_s = max(run.late_s, time.monotonic() - due)
            try:
                run.hits += client.request(f"req-{i}", trace.request(i))
            except (TimeoutError, RuntimeError) as exc:
                run.failed_requests += 1
                setup.log(f"  request {i} failed: {exc}")
        run.seconds = round(time.monotonic() - started, 1)
    finally:
        client.close()


def run_contender(
    setup: Setup, contender: str, percent: float | None, budget: float | None = None
) -> Run:
    """One contender at one capacity, from empty storage."""
    capacity_blocks = setup.trace.capacity_blocks(percent) if percent is not None else 0
    run = Run(contender, percent, capacity_blocks * setup.block_bytes, setup.trace.references)
    workdir = short_tmpdir()
    gateway: Gateway | None = None
    server: LMCacheServer | None = None
    try:
        if contender in ("ours", "gateway-lru", "ours-budget"):
            policy: dict[str, Any] = {"write_budget": "none"}
            if contender == "gateway-lru":
                policy = {"write_budget": "none", "admission": False, "eviction": "lru"}
            if contender == "ours-budget":
                assert budget is not None
                run.write_budget_bytes_per_s = budget
                burst_s = BURST_SHARE * setup.trace.duration_s / setup.speed
                policy = {"write_budget": int(budget), "write_budget_burst_s": burst_s}
            config = workdir / "gateway.yaml"
            metrics_port = free_port()
            config.write_text(gateway_config(setup, capacity_blocks, policy, metrics_port))
            gateway = Gateway(workdir, None, "--config", str(config)).start()
            assert gateway.proc is not None
            spec = gateway.l2_adapter_json()
            io_pid = gateway.proc.pid
        else:
            base = workdir / "l2"
            base.mkdir()
            fs: dict[str, Any] = {"type": "fs_native", "base_path": str(base), "use_odirect": True}
            if contender == "lmcache-lru":
                fs["max_capacity_gb"] = run.capacity_bytes / 2**30
                fs["eviction"] = {
                    "eviction_policy": "LRU",
                    "trigger_watermark": 0.95,
                    "eviction_ratio": 0.05,
                }
            spec = json.dumps(fs)
            io_pid = 0
        server = LMCacheServer(
            workdir,
            spec,
            bin_dir=LMCACHE_BIN,
            l1_size_gb=setup.l1_gb,
            chunk_size=setup.block_tokens,
            flags={"--l2-store-policy": "skip_l1"},  # L1 keeps a store only until L2 has it
        )
        server.start()
        assert server.proc is not None
        io_pid = io_pid or server.proc.pid
        written_before, read_before = process_io(io_pid)
        replay(setup, server, run)
        wait_until(server.l2_settled, SETTLE_TIMEOUT_S, "the L2 stores to settle")
        written, read = process_io(io_pid)
        run.drive_written_bytes = written - written_before
        run.drive_read_bytes = read - read_before
        hits = lmcache_hits(server)
        run.l1_hit_blocks = round(hits["l1"] / setup.block_tokens)
        run.l2_hit_blocks = round(hits["l2"] / setup.block_tokens)
        if gateway is not None:
            run.gateway = gateway_status(gateway, metrics_port)
    finally:
        if server is not None:
            server.stop()
        if gateway is not None:
            gateway.stop()
        remove_tree(workdir)
    setup.log(
        f"{contender} at {percent if percent is not None else '-'} %: "
        f"L2 hits {100 * run.l2_hit_ratio:.2f} %, all hits {100 * run.hit_ratio:.2f} %, "
        f"wrote {format_size(run.drive_written_bytes)}, read "
        f"{format_size(run.drive_read_bytes)} in {run.seconds} s (late {run.late_s:.1f} s, "
        f"{run.failed_requests} failed)"
    )
    return run


def gateway_status(gateway: Gateway, metrics_port: int) -> dict[str, Any]:
    """What admission did, the regions evicted, and the stores the plugin handed the gateway
    too late or could not hand it (``untaken_stores``: a gateway behind the store stream)."""
    from adp_gateway.observe.status import ask

    status = ask(str(gateway.socket_path))  # folds the sessions' counts into the metrics
    untaken = counter_total(metrics_port, "adp_gateway_untaken_stores_total")
    return {
        "admission": status["admission"],
        "evicted_regions": status["evicted_regions"],
        "untaken_stores": round(untaken),
    }


def offline(setup: Setup, percent: float) -> dict[str, dict[str, float]]:
    """The same capacity's offline LRU, Belady and second sighting (hit ratio, blocks written)."""
    out = {}
    for name in ("lru", "belady", "second-sighting"):
        o = run_policy(name, setup.trace, percent, setup.blocks_per_region, setup.block_bytes, 0, 0)
        out[name] = {"hit_ratio": o.hit_ratio, "blocks_written": o.blocks_written}
    return out


def run_all(
    setup: Setup, contenders: list[str], capacities: list[float], jobs: int = 1
) -> dict[str, Any]:
    """Every contender at every capacity (fs_native once), ``jobs`` runs at a time, each in a
    process of its own: a run is a server, a gateway and a client replaying one request at a
    time, so a host with cores to spare runs several side by side in the time of one. A run of
    ``ours-budget`` waits for ``gateway-lru``'s at its capacity, whose write rate sets its
    budget."""
    plain = [c for c in contenders if c not in ("fs_native", "ours-budget")]
    if "ours-budget" in contenders and "gateway-lru" not in plain:
        plain.append("gateway-lru")  # the budget's reference, reported only if asked for
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
        offline_by = {percent: pool.submit(offline, setup, percent) for percent in capacities}
        runs: dict[tuple[str, float | None], Future[Run]] = {}
        if "fs_native" in contenders:
            runs["fs_native", None] = pool.submit(run_contender, setup, "fs_native", None)
        for percent in capacities:
            for contender in plain:
                runs[contender, percent] = pool.submit(run_contender, setup, contender, percent)
        if "ours-budget" in contenders:
            for percent in capacities:
                # A quarter of what writing everything wrote per second, at this capacity.
                reference = runs["gateway-lru", percent].result()
                seconds = max(reference.seconds, 1e-9)
                budget = setup.budget_share * reference.drive_written_bytes / seconds
                runs["ours-budget", percent] = pool.submit(
                    run_contender, setup, "ours-budget", percent, budget
                )
        reported = [("fs_native", None)] + [(c, p) for p in capacities for c in contenders]
        return {
            "runs": [runs[key].result() for key in reported if key in runs],
            "offline": {percent: done.result() for percent, done in offline_by.items()},
        }


def markdown(report: dict[str, Any]) -> str:
    """Per capacity, each contender's L2 hits and drive writes beside the offline policies
    (bench/results.py renders the file's header)."""
    derived = ("l2_hit_ratio", "hit_ratio")
    runs = [Run(**{k: v for k, v in r.items() if k not in derived}) for r in report["runs"]]
    trace, block_bytes = report["trace_summary"], report["block_bytes"]
    lines = [
        f"Trace {report['trace']}{source_of(report['trace'])}: {trace['requests']} requests over "
        f"{trace['duration_s']:.0f} s of trace, replayed {report['speed']:g}x faster; "
        f"{trace['references']} block references, {trace['distinct']} distinct blocks (a cache "
        f"that never evicts hits {100 * trace['infinite_hit_ratio']:.1f} %); "
        f"{format_size(block_bytes)} per block ({report['block_tokens']} tokens of LMCache "
        f"chunk); L1 {report['l1_gb']:g} GB; gateway regions of {report['blocks_per_region']} "
        "blocks.",
        "",
        "L2 hit ratio over block references, % (all hits, L1 too, in brackets), and bytes "
        "written to the drive:",
        "",
    ]
    contenders = list(dict.fromkeys(r.contender for r in runs))
    header = ["capacity", *contenders, "offline LRU", "offline Belady", "offline 2nd sighting"]
    lines += ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    unbounded = next((r for r in runs if r.capacity_percent is None), None)
    for key, offline_at in report["offline"].items():
        percent = float(key)
        cells = [f"{percent:g} %"]
        for contender in contenders:
            run = next(
                (r for r in runs if r.contender == contender and r.capacity_percent == percent),
                unbounded if contender == "fs_native" else None,
            )
            cells.append(_cell(run))
        for name in ("lru", "belady", "second-sighting"):
            o = offline_at[name]
            written = format_size(int(o["blocks_written"] * block_bytes))
            cells.append(f"{100 * o['hit_ratio']:.2f}, {written}")
        lines.append("| " + " | ".join(cells) + " |")
    budgeted = [r for r in runs if r.write_budget_bytes_per_s]
    if budgeted:
        lines += ["", "ours-budget against its budget (bytes written to the drive per second):", ""]
        lines += ["| capacity | budget | written | of budget |", "|---|---|---|---|"]
        for r in budgeted:
            assert r.write_budget_bytes_per_s is not None and r.capacity_percent is not None
            rate = r.drive_written_bytes / max(r.seconds, 1e-9)
            lines.append(
                f"| {r.capacity_percent:g} % | {format_size(int(r.write_budget_bytes_per_s))}/s | "
                f"{format_size(int(rate))}/s | {rate / r.write_budget_bytes_per_s:.2f} |"
            )
    late = max((r.late_s for r in runs), default=0.0)
    failed = sum(r.failed_requests for r in runs)
    untaken = [
        f"{r.contender} at {r.capacity_percent:g} %: {r.gateway['untaken_stores']}"
        for r in runs
        if r.gateway.get("untaken_stores")
    ]
    lines += [
        "",
        f"Bytes read from the drive, the gateway's admission and timing are in the JSON. The "
        f"latest any request went was {late:.1f} s behind its time; {failed} requests failed "
        "in all runs.",
    ]
    if any("untaken_stores" in r.gateway for r in runs):  # reports made before lack the count
        named = "; ".join(untaken) if untaken else "none"
        lines[-1] += f" Stores the plugin could not hand the gateway in time (untaken): {named}."
    return "\n".join(lines) + "\n"


def _cell(run: Run | None) -> str:
    if run is None:
        return ""
    return (
        f"{100 * run.l2_hit_ratio:.2f} ({100 * run.hit_ratio:.2f}), "
        f"{format_size(run.drive_written_bytes)}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("trace", type=Path, help="a trace in the Mooncake format (JSON lines)")
    parser.add_argument("--requests", type=int, help="only the first N requests")
    parser.add_argument("--speed", type=float, default=4.0, help="times faster than the trace")
    parser.add_argument(
        "--block-tokens",
        type=int,
        default=16,
        help=f"LMCache's chunk size: tokens per trace block, a multiple of {PAGE_TOKENS}",
    )
    parser.add_argument("--capacities", default=",".join(f"{c:g}" for c in CAPACITIES_PERCENT))
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--l1-gb", type=float, default=0.25)
    parser.add_argument("--blocks-per-region", type=int, default=4)
    parser.add_argument("--budget-share", type=float, default=0.25)
    parser.add_argument(
        "--jobs", type=int, default=1, help="runs side by side (each a server, gateway, client)"
    )
    parser.add_argument(
        "--out", type=Path, help="write OUT.json and OUT.md (bench/results/trace-replay-vm)"
    )
    args = parser.parse_args(argv)
    if args.block_tokens <= 0 or args.block_tokens % PAGE_TOKENS:
        parser.error(f"--block-tokens must be a positive multiple of {PAGE_TOKENS}")
    unknown = set(args.contenders.split(",")) - set(CONTENDERS)
    if unknown:
        parser.error(f"unknown contenders {sorted(unknown)}; choose from {', '.join(CONTENDERS)}")
    trace = read_trace(args.trace)
    if args.requests:
        trace = trace.head(min(args.requests, trace.requests))
    setup = Setup(
        trace,
        args.trace.name,
        args.speed,
        args.block_tokens,
        args.l1_gb,
        args.blocks_per_region,
        args.budget_share,
        log=partial(print, flush=True),
    )
    where = machine(Path("."))  # before the run: the code it ran
    results = run_all(
        setup, args.contenders.split(","), [float(c) for c in args.capacities.split(",")], args.jobs
    )
    report = {
        "command": "python -m bench.trace_replay " + " ".join(argv or sys.argv[1:]),
        "machine": where,
        "trace": args.trace.name,
        "trace_summary": summary(trace),
        "speed": args.speed,
        "block_tokens": args.block_tokens,
        "block_bytes": setup.block_bytes,
        "l1_gb": args.l1_gb,
        "blocks_per_region": args.blocks_per_region,
        "jobs": args.jobs,
        "runs": [
            asdict(r) | {"l2_hit_ratio": r.l2_hit_ratio, "hit_ratio": r.hit_ratio}
            for r in results["runs"]
        ],
        "offline": {str(k): v for k, v in results["offline"].items()},
    }
    print(markdown(report))
    if args.out:
        write_result(args.out, "trace_replay", report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
