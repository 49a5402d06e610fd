"""Lookups of prompts wholly in L1 while the same LMCache server writes other prompts through to
L2: what a vLLM user feels when the storage tier is busy. Ours against ``fs_native`` and a floor
(``null``, an adapter that costs nothing: bench/null_adapter.py), one run.

    python -m bench.lookup_under_load --dir /path/on/the/disk [--prompt-mib 128] [--rounds 3]
    python -m bench.lookup_under_load --dir D --mode gpu --prompt-mib 1024   # the H200

One LMCache server is one session of our plugin: its lookups, loads and write-through stores all
share it, as in production. Per contender and round (contenders interleaved, each round on new
storage), a client process drives a real ``lmcache server`` through LMCache's own
``ServerBenchClient`` (the client of ``lmcache bench server``; GPU mode registers a CUDA KV cache
the way vLLM does):

- it stores a resident prompt and waits until L2 is idle;
- idle: LOOKUPs of the resident prompt (all chunks in L1; LMCache still asks L2 for every chunk
  and waits for the answer), each timed from the request to the answer;
- busy: it STOREs ``--prompts`` new prompts, and after each, while that prompt is being written
  through to L2, LOOKUPs the resident prompt up to ``--lookups-per-store`` times. Only lookups
  issued while the server reports pending L2 writes are made (and counted as busy). The report
  also splits them: the first lookup after each store, which meets the start of that store's
  write-through, and the others.

Contender ``null_copy`` (not in the default list) is ``null`` that also copies each store's
buffers with our plugin's own copier, on the plugin's default copy threads: what reading L1 inside
LMCache's process costs a lookup, apart from the rest of our plugin and gateway.
``null_copy_process`` has another process copy as many bytes, the same way, instead: the same
traffic on the host's memory and cores, none of it in LMCache's process. ``null_checksum`` only
reads each store's buffers once, taking their fragments' checksums as a zero-copy store does: the
least per-byte work inside LMCache's process of an adapter that checks what it stores;
``null_checksum_process`` has another process do as much. ``null_write_process`` has another
process write as many bytes to the disk (O_DIRECT, at the gateway's fragment size and I/O
threads): the floor for any adapter that persists what it stores, on a host whose disk traffic
itself slows LMCache's lookups. ``null_persist_process`` has another process take the
checksums of as many bytes and then write them: the floor for our zero-copy stores, which do
both outside LMCache's process. ``null_shm`` is ``null`` with the server's L1 in shared memory,
as for ``lmcache_adp_shm``: the floor for zero-copy.

Contender ``lmcache_adp_shm`` (not in the default list) is ours with the server's L1 in a
shared-memory segment (``--shm-name``), where the plugin stores zero-copy: the gateway writes
from L1, and no prompt is copied into the session's window.

Contenders ``lmcache_adp_delayed`` and ``lmcache_adp_shm_delayed`` are ours with each store
handed to the plugin ``delay_ms`` (30) after LMCache submits it (bench/delayed_adapter.py): the
first lookup after a store then no longer meets the start of our write-through.

Then, ours alone, through the plugin in this process (an ``ADPConnector`` on its own session):
1,000-key EXISTS latency idle, and with ``--backlog-mib`` of stores kept pending on the same
session (each completed store is replaced at once); both back to back (the next lookup as soon as
the last is answered) and paced at ``--exists-per-second`` (vLLM asks once per new request).

Writes bench/results/lookup_under_load.json and .md (``--out`` changes the stem).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from bench import gateways
from bench.machine import machine
from bench.results import write as write_result
from bench.stats import summary_us
from lmcache_adp import ADPConnector
from tests.support import BIN, Gateway, LMCacheServer, remove_tree, short_tmpdir, wait_until

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
BYTES_PER_TOKEN = 128 * 2**10  # the shape below: 2 x 32 layers x 8 heads x 128 x bf16
KV_SHAPE = "(2,{blocks},16,8,128):bfloat16:32"
MiB = 2**20
NULL_ADAPTER = {  # the floor: an adapter that costs LMCache nothing (bench/null_adapter.py)
    "type": "native_plugin",
    "module_path": "bench.null_adapter",
    "class_name": "NullConnector",
}


# The client: one process driving one lmcache server -------------------------------------------


def client_main(args: argparse.Namespace) -> int:
    shim = os.environ.get("LMC_C10_SHIM")  # the H200's torch needs it (bench/gpu_lmc.py)
    import torch  # noqa: F401

    if shim:
        import ctypes

        ctypes.CDLL(shim, mode=ctypes.RTLD_GLOBAL)
    from lmcache.cli.commands.bench.server_bench import helpers
    from lmcache.cli.commands.bench.server_bench.client import ServerBenchClient
    from lmcache.cli.commands.bench.server_bench.config import BenchConfig

    tokens = args.prompt_mib * MiB // BYTES_PER_TOKEN
    config = BenchConfig(
        rpc_url=f"tcp://localhost:{args.port}",
        http_url=f"http://localhost:{args.http_port}",
        mode=args.mode,
        transfer_mode=args.transfer_mode,
        tp_size=1,
        use_mla=False,
        num_tokens=tokens - 1,  # the client prepends one token
        # Room for two prompts: every request reuses the same blocks (their bytes do not matter
        # to a lookup), so the client's KV cache stays small on any host.
        kvcache_shape_spec=KV_SHAPE.format(blocks=2 * tokens // 16),
        num_blocks=2 * tokens // 16,
        block_size=16,
    )
    client = ServerBenchClient(config, lambda message: None)
    client.start()

    def lookup_ms(request: Any) -> tuple[int | None, float]:
        key = helpers._make_key(
            request.token_ids,
            request.request_id,
            start=0,
            end=request.num_full_tokens,
            world_size=client._kv_world_size,
        )
        started = time.perf_counter()
        if not helpers._send_lookup(client._req_client, key, tp_size=len(client._workers)):
            return None, 0.0
        while True:
            answer = helpers._wait_for_result(
                client._req_client.query_prefetch_status(request.request_id)
            )
            if answer is not helpers._TIMEOUT and answer is not None:
                return int(answer), (time.perf_counter() - started) * 1e3
            if time.perf_counter() - started > 60:
                return None, (time.perf_counter() - started) * 1e3
            time.sleep(0.0002)

    def pending() -> int:
        url = f"http://127.0.0.1:{args.http_port}/status"
        with urllib.request.urlopen(url, timeout=5) as response:
            controller = json.load(response)["storage_manager"]["store_controller"]
        return int(controller["pending_keys_count"]) + int(controller["in_flight_task_count"])

    notes: list[str] = []

    def look(seq: int, tag: str) -> float:
        request = client.create_request(seq, tag, "warm")
        hits, ms = lookup_ms(request)
        if hits != request.total_chunks:
            notes.append(f"{tag}: {hits}/{request.total_chunks} chunks hit")
        client.end_session(request)
        return ms

    try:
        resident = client.create_request(0, "resident", "cold")
        client.store(resident, 0, resident.num_full_tokens)
        client.end_session(resident)

        def resident_in_l1() -> bool:  # a store can end after its call returns, on a busy host
            request = client.create_request(0, "ready", "warm")
            hits, _ = lookup_ms(request)
            client.end_session(request)
            return bool(hits == request.total_chunks)

        wait_until(resident_in_l1, 600, "the resident prompt to be in L1")
        wait_until(lambda: pending() == 0, 600, "L2 to take the resident prompt")
        idle = [look(0, f"idle-{i}") for i in range(args.idle_lookups)]
        busy: list[float] = []
        first: list[bool] = []  # per busy lookup: the first one after its store
        # CLOCK_MONOTONIC ns, the clock of ADP_TRACE's stamps (adp_wire/trace.py): when each
        # busy lookup started, and when each store call started and returned
        busy_at: list[int] = []
        stores_at: list[tuple[int, int]] = []
        skipped = 0
        for seq in range(1, args.prompts + 1):
            request = client.create_request(seq, f"store-{seq}", "cold")
            started = time.monotonic_ns()
            client.store(request, 0, request.num_full_tokens)
            stores_at.append((started, time.monotonic_ns()))
            client.end_session(request)
            for i in range(args.lookups_per_store):
                if not pending():  # this prompt is in L2 already: the next store makes it busy
                    skipped += args.lookups_per_store - i
                    break
                busy_at.append(time.monotonic_ns())
                busy.append(look(0, f"busy-{seq}-{i}"))
                first.append(i == 0)
        wait_until(lambda: pending() == 0, 600, "L2 to settle")
    finally:
        client.close()
    result = {
        "idle_ms": idle,
        "busy_ms": busy,
        "busy_first_after_store": first,
        "busy_at_ns": busy_at,
        "stores_at_ns": stores_at,
        "busy_skipped_l2_idle": skipped,
        "notes": notes,
        "chunks_per_prompt": resident.total_chunks,
    }
    Path(args.json_out).write_text(json.dumps(result))
    return 0 if not notes else 1


# The driver --------------------------------------------------------------------------------


OURS = ("lmcache_adp", "lmcache_adp_shm", "lmcache_adp_delayed", "lmcache_adp_shm_delayed")
DELAYED_ADAPTER = {"module_path": "bench.delayed_adapter", "class_name": "DelayedStores"}
NULL_COPY: dict[str, bool | str] = {  # the null adapter's contenders: its ``copy`` param
    "null": False,
    "null_copy": True,
    "null_copy_process": "process",
    "null_checksum": "checksum",
    "null_checksum_process": "process-checksum",
    "null_write_process": "process-write",
    "null_persist_process": "process-persist",
    "null_shm": False,
}


def run_contender(args: argparse.Namespace, contender: str, workdir: Path) -> dict[str, Any]:
    """One round of one contender on new storage: its client's lookup latencies. Ours may
    carry adapter params: ``lmcache_adp@copy_threads=1;op_timeout_s=30``, and settings for its
    gateway's config: ``lmcache_adp#card=memory;io_threads=2``; any contender an environment
    variable for its server: ``null_copy!GLIBC_TUNABLES=glibc.cpu.x=1``."""
    contender, _, variable = contender.partition("!")
    server_env = dict([variable.split("=", 1)]) if variable else {}
    contender, _, gateway_settings = contender.partition("#")
    name, plugin_params = gateways.contender_settings(contender)
    gateway_config = gateways.settings_of(gateway_settings)
    workdir.mkdir(parents=True)
    gateway = None
    sockdir = short_tmpdir()
    try:
        if name in OURS:
            capacity = f"{max(1024, args.prompt_mib * (args.prompts + 4))}MiB"
            config = gateways.write_config(workdir / "gateway.yaml", gateway_config)
            gateway = Gateway(
                workdir, capacity, "--config", str(config), socket_path=sockdir / "gw.sock"
            )
            error = gateways.start(gateway, module=True)
            if error is not None:
                raise RuntimeError(f"the gateway did not start: {error}")
            spec = gateway.l2_adapter_json(**{"op_timeout_s": 60.0, **plugin_params})
            if name.endswith("_delayed"):
                spec = json.dumps(json.loads(spec) | DELAYED_ADAPTER)
        elif name in NULL_COPY:
            copy = NULL_COPY[name]
            params = {"store_gbps": args.null_gbps, "copy": copy, "write_dir": str(workdir)}
            spec = json.dumps(NULL_ADAPTER | {"adapter_params": params})
        else:
            (workdir / "l2").mkdir()
            spec = json.dumps(
                {"type": "fs_native", "base_path": str(workdir / "l2"), "use_odirect": True}
            )
        l1_gb = -(-args.prompt_mib * (args.prompts + 2) // 1024) + 1
        # lmcache_adp_shm: L1 in a shared-memory segment, so the plugin's stores go zero-copy.
        shm = f"adp-lul-{os.getpid()}" if "_shm" in name else None
        server = LMCacheServer(
            workdir, spec, "", Path(args.lmcache_bin), l1_gb, shm, server_env
        ).start()
        try:
            out = workdir / "client.json"
            argv = [sys.executable, "-m", "bench.lookup_under_load", "client"]
            argv += [f"--port={server.port}", f"--http-port={server.http_port}"]
            argv += [f"--json-out={out}", f"--mode={args.mode}"]
            argv += [f"--transfer-mode={args.transfer_mode}", f"--prompt-mib={args.prompt_mib}"]
            argv += [f"--prompts={args.prompts}", f"--lookups-per-store={args.lookups_per_store}"]
            argv += [f"--idle-lookups={args.idle_lookups}"]
            with open(workdir / "client.log", "wb") as log:
                done = subprocess.run(
                    argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=1800
                )
            if not out.exists():
                tail = (workdir / "client.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the client failed (exit {done.returncode}):\n{tail}")
            result: dict[str, Any] = json.loads(out.read_text())
            result["client_exit"] = done.returncode
            return result
        finally:
            server.stop()
    finally:
        if gateway is not None:
            gateway.stop()
        if args.logs:
            shutil.copytree(
                workdir,
                Path(args.logs) / f"{name}-{workdir.name}",
                dirs_exist_ok=True,
                ignore=lambda _, names: [n for n in names if not n.endswith((".log", ".json"))],
            )
        remove_tree(workdir)
        remove_tree(sockdir)


def exists_under_backlog(args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    """1,000-key EXISTS through the plugin, idle and with ``--backlog-mib`` of stores pending
    on the same session; back to back, and paced at ``--exists-per-second``."""
    workdir = directory / "exists"
    workdir.mkdir(parents=True)
    sockdir = short_tmpdir()
    gateway = Gateway(workdir, "4GiB", socket_path=sockdir / "gw.sock")
    backlog = args.backlog_mib * MiB
    try:
        error = gateways.start(gateway, module=True)
        if error is not None:
            raise RuntimeError(f"the gateway did not start: {error}")
        connector = ADPConnector(**gateway.adapter_params(op_timeout_s=60.0))
        try:
            results: dict[str, Any] = {}
            paced_s = 1 / args.exists_per_second
            for pacing, interval_s in (("back_to_back", 0.0), ("paced", paced_s)):
                for phase, pending in (("idle", 0), ("backlog", backlog)):
                    results[f"{pacing}_{phase}"] = _exists_latencies(
                        connector, pending, args.exists_seconds, interval_s
                    )
            return results
        finally:
            connector.close()
    finally:
        gateway.stop()
        remove_tree(workdir)
        remove_tree(sockdir)


def _exists_latencies(
    connector: ADPConnector, backlog_bytes: int, seconds: float, interval_s: float
) -> dict[str, Any]:
    """EXISTS of 1,000 keys for ``seconds``, each ``interval_s`` after the last one started (at
    once after the last answer when 0), while stores of 32 MiB are kept ``backlog_bytes`` deep
    on the same session."""
    object_bytes = 32 * MiB
    buffers = [
        memoryview(np.random.default_rng(i).integers(0, 256, object_bytes, np.uint8).tobytes())
        for i in range(max(1, backlog_bytes // object_bytes))
    ]
    keys = [f"bench@00000000@0@{i:064x}" for i in range(1000)]
    stores: dict[int, int] = {}  # future id -> buffer index
    serial = iter(range(10**9))

    def store(index: int) -> None:
        future = connector.submit_batch_set([f"backlog-{next(serial)}"], [buffers[index]])
        stores[future] = index

    if backlog_bytes:
        for index in range(len(buffers)):
            store(index)
    samples: list[int] = []
    failed = stored = 0
    submitted = time.perf_counter_ns()  # the plugin may answer inside the submit call
    lookup = connector.submit_batch_exists(keys)
    next_at = time.monotonic() + interval_s  # when the next lookup is due
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        wait_s = 1.0 if lookup else max(0.0, next_at - time.monotonic())
        select.select([connector.event_fd()], [], [], wait_s)
        for future_id, ok, _, _ in connector.drain_completions():
            if future_id in stores:
                stored += ok
                store(stores.pop(future_id))
            elif future_id == lookup:
                samples.append(time.perf_counter_ns() - submitted)
                failed += not ok
                lookup = 0
        if not lookup and time.monotonic() >= next_at:
            submitted = time.perf_counter_ns()
            lookup = connector.submit_batch_exists(keys)
            next_at = max(next_at + interval_s, time.monotonic()) if interval_s else 0.0
    deadline = time.monotonic() + 120
    while stores and time.monotonic() < deadline:  # let the backlog drain before the next phase
        select.select([connector.event_fd()], [], [], 1.0)
        for future_id, *_ in connector.drain_completions():
            stores.pop(future_id, None)
    return {**summary_us(samples), "failed": failed, "stores_completed": stored}


def percentiles(samples: list[float]) -> dict[str, float]:
    if not samples:
        return {"samples": 0}
    values = np.asarray(samples)
    return {
        "samples": len(samples),
        "p50_ms": float(np.percentile(values, 50)),
        "p99_ms": float(np.percentile(values, 99)),
        "max_ms": float(values.max()),
    }


def drive_main(args: argparse.Namespace) -> int:
    directory = Path(args.dir)
    directory.mkdir(parents=True, exist_ok=True)
    contenders = args.contenders.split(",")
    report: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "machine": machine(directory),
        "prompt_mib": args.prompt_mib,
        "mode": args.mode,
        "backlog_mib": args.backlog_mib,
        "exists_per_second": args.exists_per_second,
        "null_gbps": args.null_gbps,
        "rounds": {name: [] for name in contenders},
    }
    stem = RESULTS / args.out
    for round_number in range(args.rounds):
        for index, name in enumerate(contenders):  # interleaved: ours, fs_native, null, ours...
            try:  # the directory's name is plain (a contender may carry "!VAR=value")
                result = run_contender(args, name, directory / f"c{index}-{round_number}")
            except Exception as exc:  # recorded, and the other contenders still run
                result = {"failed": f"{type(exc).__name__}: {exc}"[-1500:]}
            report["rounds"][name].append(result)
            print(name, round_number, _line(result), flush=True)
            report["summary"] = {n: _summarize(r) for n, r in report["rounds"].items()}
            write(report, stem)  # each round is kept, whatever cuts the run short
    if "lmcache_adp" in contenders and not args.skip_exists:
        report["exists_1000_keys"] = exists_under_backlog(args, directory)
        write(report, stem)
    print(render(report))
    return 0


def write(report: dict[str, Any], stem: Path) -> None:
    write_result(stem, "lookup_under_load", report)


def _summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over rounds of each round's p50 and p99, idle and busy; and each round's gap
    (its busy p99 minus its idle p99: the target's measure), None for a round that failed."""
    good = [r for r in rounds if "failed" not in r]
    out: dict[str, Any] = {"rounds_ok": len(good), "rounds": len(rounds)}
    for phase in ("idle", "busy"):
        per_round = [percentiles(r[f"{phase}_ms"]) for r in good if r[f"{phase}_ms"]]
        for stat in ("p50_ms", "p99_ms"):
            values = [p[stat] for p in per_round]
            out[f"{phase}_{stat}"] = statistics.median(values) if values else None
    out["gaps_ms"] = [_gap(r) for r in rounds]
    split = [_after_store(r) for r in good if r.get("busy_first_after_store")]
    for stat in ("first_p50_ms", "others_p99_ms"):
        kept = [value for s in split if (value := s[stat]) is not None]
        out[stat] = statistics.median(kept) if kept else None
    out["full_hits"] = all(not r.get("notes") for r in good)
    return out


def _gap(result: dict[str, Any]) -> float | None:
    if "failed" in result or not result["idle_ms"] or not result["busy_ms"]:
        return None
    busy, idle = percentiles(result["busy_ms"]), percentiles(result["idle_ms"])
    return float(busy["p99_ms"] - idle["p99_ms"])


def _after_store(result: dict[str, Any]) -> dict[str, float | None]:
    """The busy lookups split in two: the median of the first lookup after each store, and the
    p99 of all the others (the first one meets the start of the store's write-through)."""
    busy, first = result["busy_ms"], result["busy_first_after_store"]
    firsts = [ms for ms, is_first in zip(busy, first, strict=True) if is_first]
    others = [ms for ms, is_first in zip(busy, first, strict=True) if not is_first]
    return {
        "first_p50_ms": float(np.percentile(firsts, 50)) if firsts else None,
        "others_p99_ms": float(np.percentile(others, 99)) if others else None,
    }


def _median_gap(gaps: list[float | None]) -> str:
    values = [gap for gap in gaps if gap is not None]
    return f"{statistics.median(values):.1f}" if values else "-"


def _line(result: dict[str, Any]) -> str:
    if "failed" in result:
        return f"FAILED {result['failed'][-300:]}"
    idle, busy = percentiles(result["idle_ms"]), percentiles(result["busy_ms"])
    return f"idle {idle} busy {busy} notes {result['notes'][:3]}"


def render(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"{m['cpus']} CPUs, load average "
        f"{m['loadavg_start'][0]:.2f} at start, {m['dir_filesystem']}. Prompts of "
        f"{report['prompt_mib']} MiB, {report['mode']} mode. Medians over rounds of each "
        "round's percentiles; every lookup a full L1 hit unless noted.",
        "",
        "| contender | rounds ok | idle p50 ms | idle p99 ms | busy p50 ms | busy p99 ms "
        "| gap per round (busy p99 - idle p99) | median gap | median gap over null | full hits |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    null_gaps = report["summary"].get("null", {}).get("gaps_ms")
    for name, s in report["summary"].items():
        gaps = s.get("gaps_ms", [])
        over_null = "-"
        if null_gaps is not None and name != "null":  # rounds are interleaved: pair them
            pairs = zip(gaps, null_gaps, strict=False)
            over_null = _median_gap([a - b if None not in (a, b) else None for a, b in pairs])
        lines.append(
            f"| {name} | {s['rounds_ok']}/{s['rounds']} | {_ms(s.get('idle_p50_ms'))} "
            f"| {_ms(s.get('idle_p99_ms'))} | {_ms(s.get('busy_p50_ms'))} "
            f"| {_ms(s.get('busy_p99_ms'))} | {', '.join(map(_ms, gaps))} "
            f"| {_median_gap(gaps)} | {over_null} | {s['full_hits']} |"
        )
    if "null" in report["summary"]:
        lines += [
            "",
            "`null` is the floor: an adapter that costs LMCache nothing (bench/null_adapter.py; "
            f"no bytes kept, a store done after the time {report.get('null_gbps', 1.5)} GB/s "
            "would take, EXISTS answered at once). What it shows between idle and busy is "
            "LMCache's own work on the prompt being written through, which no adapter removes.",
        ]
    if any(s.get("first_p50_ms") is not None for s in report["summary"].values()):
        lines += [
            "",
            "The busy lookups split: the first one after each store (it meets the start of that "
            "store's write-through), and the others. Medians over rounds.",
            "",
            "| contender | first lookup after a store, p50 ms | the other busy lookups, p99 ms |",
            "|---|---|---|",
        ]
        lines += [
            f"| {name} | {_ms(s.get('first_p50_ms'))} | {_ms(s.get('others_p99_ms'))} |"
            for name, s in report["summary"].items()
        ]
    exists = report.get("exists_1000_keys")
    if exists:
        lines += [
            "",
            "## 1,000-key EXISTS through the plugin (its own session)",
            "",
            f"Back to back (the next lookup as soon as the last is answered: the lookups alone "
            f"keep about one of the machine's cores busy), and paced at "
            f"{report['exists_per_second']} lookups a second (a new vLLM request every "
            f"{1000 / report['exists_per_second']:.0f} ms).",
            "",
            "| lookups | stores pending on the session | p50 µs | p99 µs | samples | failed |",
            "|---|---|---|---|---|---|",
        ]
        backlog = f"{report['backlog_mib']} MiB, kept full"
        for pacing, pacing_label in (("back_to_back", "back to back"), ("paced", "paced")):
            for phase, label in (("idle", "none"), ("backlog", backlog)):
                e = exists[f"{pacing}_{phase}"]
                lines.append(
                    f"| {pacing_label} | {label} | {e.get('p50_us', 0):.0f} "
                    f"| {e.get('p99_us', 0):.0f} | {e['samples']} | {e['failed']} |"
                )
    return "\n".join(lines) + "\n"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("role", nargs="?", default="drive", choices=["drive", "client"])
    parser.add_argument("--dir", help="where both contenders keep their data (on the disk)")
    parser.add_argument("--prompt-mib", type=int, default=128)
    parser.add_argument("--prompts", type=int, default=12, help="prompts stored while busy")
    parser.add_argument("--lookups-per-store", type=int, default=5)
    parser.add_argument("--idle-lookups", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--contenders", default="lmcache_adp,fs_native,null")
    parser.add_argument(
        "--null-gbps", type=float, default=1.5, help="how fast the null floor 'writes' (GB/s)"
    )
    parser.add_argument("--mode", default="cpu", choices=["cpu", "gpu"])
    parser.add_argument("--transfer-mode", default=None)
    parser.add_argument("--lmcache-bin", default=str(BIN))
    parser.add_argument("--backlog-mib", type=int, default=256)
    parser.add_argument("--exists-seconds", type=float, default=10.0)
    parser.add_argument("--exists-per-second", type=float, default=100.0)
    parser.add_argument("--skip-exists", action="store_true")
    parser.add_argument("--logs", default=None, help="keep every contender's logs here")
    parser.add_argument("--out", default="lookup_under_load")
    parser.add_argument("--port", type=int)
    parser.add_argument("--http-port", type=int)
    parser.add_argument("--json-out")
    args = parser.parse_args()
    if args.transfer_mode is None:
        args.transfer_mode = "engine_driven" if args.mode == "cpu" else "lmcache_driven"
    if args.role == "client":
        return client_main(args)
    if args.dir is None:
        parser.error("--dir is required")
    return drive_main(args)


if __name__ == "__main__":
    sys.exit(main())
