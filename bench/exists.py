"""EXISTS latency for batches of 1 and 1,000 keys: through the plugin, and inside the gateway.

    python -m bench.exists --dir /path/on/the/disk [--objects 10000] [--index-entries 100000] \
        [--rounds 500] [--out bench/results/exists.json]

Through the plugin (end to end): a gateway on ``--dir`` is given ``--objects`` small objects
through the plugin first; then each sample is ``ADPConnector.submit_batch_exists`` of known keys
until its completion is drained after the plugin's event fd fired (tests.support.wait_for_future,
as LMCache waits).

Inside the gateway (in this process): the gateway's own card (adp_gateway.service.Gateway, not
listening) holding ``--index-entries`` objects, and the gateway's own Session on a socketpair,
its ``run`` loop on a thread as in the gateway. A sample is one EXISTS batch from the doorbell
to its last completion in the completion queue: the session's wake-up, its checks, key
decoding, ObjectStore.exists, the per-key results and the completions, all the product's code. The
keys are split into ring requests by the plugin's own split (``lmcache_adp.lanes.key_runs``, at
most RUN_BYTES_MAX bytes of keys each), so a 1,000-key batch is the requests the gateway really
gets. Target: 1,000 keys under 1 ms p99.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import mmap
import os
import select
import shutil
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from adp_gateway import config as gateway_config
from adp_gateway.objects.store import ObjectStore
from adp_gateway.service import Gateway as GatewayProcess
from adp_gateway.sessions.session import Session
from adp_wire.protocol import Op, Status
from adp_wire.protocol import encode_keys as encode_request_keys
from adp_wire.ring.layout import Completion, RingLayout, Submission, align_up, map_shared
from adp_wire.ring.queue import (
    completion_consumer,
    submission_producer,
)
from bench import gateways, plugin
from bench.results import write as write_result
from bench.stats import summary_us
from lmcache_adp.batch import Batch
from lmcache_adp.lanes import key_runs
from tests.support import Gateway, short_tmpdir, wait_for_future

BATCHES = (1, 1000)
TENANT = "default"  # the plugin's default tenant
TARGET_P99_US = 1000.0


def through_plugin(
    directory: Path, objects: int, object_bytes: int, rounds: int, batches: tuple[int, ...]
) -> dict[str, Any]:
    """End-to-end EXISTS latency against a gateway holding ``objects`` objects."""
    workdir = directory / "exists"
    workdir.mkdir(parents=True)
    sockdir = short_tmpdir()
    config = gateways.write_config(workdir / "gateway.yaml", {"sync": "none"})  # faster filling
    gateway = Gateway(
        workdir,
        gateways.capacity_for(objects, object_bytes),
        "--config",
        str(config),
        socket_path=sockdir / "gw.sock",
    )
    connector = None
    try:
        error = gateways.start(gateway)
        if error is not None:
            raise RuntimeError(f"the gateway did not start: {error}")
        connector = plugin.connect(gateway, op_timeout_s=120)
        plugin.wait_connected(connector)
        keys = plugin.object_keys(objects)
        stored = plugin.store_all(connector, keys, object_bytes)
        rng = np.random.default_rng(1)
        result: dict[str, Any] = {
            "objects": objects,
            "object_bytes": object_bytes,
            "populate": stored,
        }
        for batch in batches:
            samples: list[int] = []
            failed = 0
            picks = [[keys[i] for i in rng.integers(0, objects, batch)] for _ in range(rounds)]
            for i, sample_keys in enumerate(picks[: min(20, rounds)] + picks):
                started = time.perf_counter_ns()
                item = wait_for_future(connector, connector.submit_batch_exists(sample_keys))
                elapsed = time.perf_counter_ns() - started
                if not item[1] or not all(item[3] or []):
                    failed += 1  # the link dropped (logged by the plugin): reconnect, go on
                    plugin.wait_connected(connector)
                elif i >= min(20, rounds):  # the first ones warm up
                    samples.append(elapsed)
            result[f"batch_{batch}"] = {**summary_us(samples), "failed_ops": failed}
        result["sessions_dropped"] = gateways.dropped_sessions(gateway)
        return result
    finally:
        if connector is not None:
            connector.close()
        gateway.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(sockdir, ignore_errors=True)


def inside_gateway(
    directory: Path, entries: int, object_bytes: int, rounds: int, batches: tuple[int, ...]
) -> dict[str, Any]:
    """The gateway's own EXISTS path over its card holding ``entries`` objects, in process."""
    workdir = directory / "exists-inside"
    workdir.mkdir(parents=True)
    config = gateway_config.load(
        None,
        {
            "data_dirs": str(workdir),
            "socket": str(workdir / "unused.sock"),
            "capacity": gateways.capacity_for(entries, object_bytes),
            "sync": "none",
        },
    )
    process = None
    try:
        process = GatewayProcess(config)  # opens and recovers the store; never listens
        store = process.store
        keys = plugin.object_keys(entries)
        started = time.perf_counter()
        _fill(store, keys, object_bytes)
        result: dict[str, Any] = {
            "index_entries": len(keys),
            "fill_seconds": time.perf_counter() - started,
            "target_p99_us": TARGET_P99_US,
        }
        rng = np.random.default_rng(2)
        for batch in batches:
            picks = [[keys[i] for i in rng.integers(0, entries, batch)] for _ in range(rounds)]
            result[f"batch_{batch}"] = _time_session_path(process, config.session_arena_size, picks)
        return result
    finally:
        if process is not None:
            process.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _fill(store: ObjectStore, keys: list[str], object_bytes: int) -> None:
    extent = memoryview(mmap.mmap(-1, align_up(object_bytes)))  # as the transfer window is
    for key in keys:
        store.put(TENANT, key, extent, object_bytes)
    found = store.exists(TENANT, keys)
    if not all(found):
        raise RuntimeError(f"the store holds {sum(found)} of the {len(keys)} objects put")


def plugin_runs(keys: list[str]) -> Iterator[list[str]]:
    """The ring requests the plugin makes of one EXISTS batch: its own split."""
    return (request.keys for request in key_runs(Batch(0, Op.EXISTS, keys, None, 0)))


def _time_session_path(
    process: GatewayProcess, arena_bytes: int, picks: list[list[str]]
) -> dict[str, Any]:
    """Time the gateway's own Session (adp_gateway/sessions/session.py) answering each EXISTS batch:
    from the doorbell to the batch's last completion in the completion queue, with ``Session.run``
    on its own thread as in the gateway. The client's side (requests into the arenas before the
    doorbell, answers read after) is this process, as the plugin would do it, and is not timed."""
    requests_max = max(len(list(plugin_runs(keys))) for keys in picks)
    layout = RingLayout(max(8, requests_max), arena_bytes, mmap.PAGESIZE)
    ours, theirs = socket.socketpair()
    session = Session(
        1, theirs, TENANT, "bench", layout, process.store, process.scheduler,
        lambda _: None, process.metrics,
    )  # fmt: skip
    _, (memfd, submitted, completed) = session.welcome()
    memory = memoryview(map_shared(memfd, layout))  # before run() closes the session's memfd
    client_sq, client_cq = submission_producer(memory, layout), completion_consumer(memory, layout)
    doorbell_poll = select.poll()
    doorbell_poll.register(completed, select.POLLIN)
    runner = threading.Thread(target=session.run, name="bench-session", daemon=True)
    runner.start()
    total: list[int] = []
    op_ids = itertools.count(1)
    try:
        for keys in picks:
            deadline_ns = time.monotonic_ns() + 10 * 10**9
            runs = list(plugin_runs(keys))
            for slot, run in enumerate(runs):
                payload = encode_request_keys(run)
                layout.arena(memory, slot)[: len(payload)] = payload
                entry = Submission(
                    next(op_ids), Op.EXISTS, 0, 0, slot, len(payload), 0, deadline_ns, 0, 0
                )
                if not client_sq.push(entry):
                    raise AssertionError("the submission queue is full")
            done: list[Completion] = []
            t0 = time.perf_counter_ns()
            os.eventfd_write(submitted, 1)
            while len(done) < len(runs):
                done += client_cq.pop_all()
                # Wait on the doorbell, as the plugin does: a loop that spins keeps the GIL
                # from the session's thread for a switch interval (5 ms) at a time.
                if len(done) < len(runs) and doorbell_poll.poll(10_000):
                    with contextlib.suppress(BlockingIOError):
                        os.eventfd_read(completed)
            total.append(time.perf_counter_ns() - t0)
            for completion in done:
                answers = bytes(layout.arena(memory, completion.slot)[: completion.result_bytes])
                if completion.status != Status.OK or not all(answers):
                    raise AssertionError(f"a known key was not found ({Status(completion.status)})")
    finally:
        ours.close()  # the session sees its client gone and closes itself
        runner.join(10)
        memory.release()
    summary = summary_us(total)
    return {
        **summary,
        "ring_requests": requests_max,
        "meets_target": summary.get("p99_us", float("inf")) < TARGET_P99_US,
    }


def run(
    directory: Path,
    objects: int,
    index_entries: int,
    rounds: int,
    object_bytes: int = 4096,
    batches: tuple[int, ...] = BATCHES,
) -> dict[str, Any]:
    directory.mkdir(parents=True, exist_ok=True)
    return {
        "through_plugin": through_plugin(directory, objects, object_bytes, rounds, batches),
        "inside_gateway": inside_gateway(directory, index_entries, object_bytes, rounds, batches),
    }


def table(result: dict[str, Any]) -> str:
    """Markdown: p50 / p99 in microseconds, end to end and inside the gateway, per batch."""
    plugin_side = result.get("through_plugin", {})
    inside = result.get("inside_gateway", {})
    lines = [
        f"| keys per EXISTS | through the plugin p50 / p99 µs "
        f"({plugin_side.get('objects', '?')} objects stored) | inside the gateway p50 / p99 µs "
        f"({inside.get('index_entries', '?')} entries) | ring requests |",
        "|---|---|---|---|",
    ]
    for batch in BATCHES:
        e2e = plugin_side.get(f"batch_{batch}", {})
        gw = inside.get(f"batch_{batch}", {})
        lines.append(f"| {batch:,} | {_pair(e2e)} | {_pair(gw)} | {gw.get('ring_requests', '-')} |")
    gw = inside.get("batch_1000")
    if gw and "p99_us" in gw:
        verdict = "met" if gw["meets_target"] else "NOT met"
        lines.append(
            f"\nTarget, 1,000-key EXISTS under {TARGET_P99_US:.0f} µs p99 inside the gateway: "
            f"{verdict} ({gw['p99_us']:.0f} µs)."
        )
    return "\n".join(lines)


def _pair(summary: dict[str, Any]) -> str:
    if "p50_us" not in summary:
        return "-"
    failed = f" ({summary['failed_ops']} failed)" if summary.get("failed_ops") else ""
    return f"{summary['p50_us']:.0f} / {summary['p99_us']:.0f}{failed}"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--objects", type=int, default=10_000, help="stored through the plugin")
    parser.add_argument("--index-entries", type=int, default=100_000, help="in-process store")
    parser.add_argument("--object-kb", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=500, help="samples per batch size")
    parser.add_argument("--out", type=Path, default=Path("bench/results/exists.json"))
    args = parser.parse_args()
    result = run(args.dir, args.objects, args.index_entries, args.rounds, args.object_kb * 1024)
    command = " ".join(["python -m bench.exists", *sys.argv[1:]])
    write_result(args.out.with_suffix(""), "exists", {"command": command, **result})
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
