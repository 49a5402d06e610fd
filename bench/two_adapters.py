"""Lookup latency of an ``lmcache server`` with our adapter alone, with ours and LMCache's
Redis adapter (`resp`) both, and with Redis alone: does a second L2 slow our lookups?

    python -m bench.two_adapters [--prompts 8] [--chunks 4] [--rounds 200] [--passes 3] \
        [--out bench/results/two_adapters]

LMCache asks every L2 adapter about every chunk of every lookup, in parallel, and waits for all
of them, even when L1 holds the whole prompt; so a lookup costs the slower adapter's EXISTS.
For each setting a fresh gateway, a fresh redis-server (both on this machine) and a fresh
server (configs/two-adapters.sh for both; one --l2-adapter otherwise) get ``--prompts`` prompts
of ``--chunks`` chunks stored, then each sample is one vLLM-style lookup (LMCache's
``LMCacheMPSchedulerAdapter``: LOOKUP, then QUERY_PREFETCH_STATUS polled until done), timed
from submit to the answer, of:

- ``l1_hit``: a stored prompt, all of it in L1 (the common case; L2 is still asked);
- ``miss``: a prompt never stored (every adapter answers no; nothing is loaded).

The settings take turns (``--passes`` rounds of all three), so a busy machine weighs on each
alike; the summary pools every pass's samples, and each pass is kept in the JSON. Needs
redis-server (or valkey-server) on PATH.
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.results import write as write_result
from bench.stats import summary_us
from tests.support import Gateway, LMCacheServer, remove_tree, short_tmpdir, wait_until
from tests.support.compat import MultiAdapterServer, RedisServer, TwoAdaptersServer, client
from tests.support.vllm_client import BLOCK_SIZE, Client, kv_for, pack, tokens_for

SETTINGS = ("adp_alone", "adp_and_redis", "redis_alone")
SETTING_LABELS = {
    "adp_alone": "ours alone",
    "adp_and_redis": "ours and Redis (`configs/two-adapters.sh`)",
    "redis_alone": "Redis alone",
}


def start_server(
    setting: str, workdir: Path, gateway: Gateway, redis: RedisServer
) -> LMCacheServer:
    if setting == "adp_and_redis":
        return TwoAdaptersServer(workdir, gateway.socket_path, redis.port, tag="-both").start()
    spec = gateway.l2_adapter_json() if setting == "adp_alone" else redis.spec()
    return MultiAdapterServer(workdir, [spec], tag=f"-{setting}").start()


def summarize(samples: list[int]) -> dict[str, Any]:
    summary: dict[str, Any] = summary_us(samples)
    summary["p90_us"] = float(np.percentile(np.asarray(samples) / 1e3, 90))
    return summary


def timed_lookup(lookups: Client, tokens: list[int], request_id: str) -> tuple[int, int]:
    """One lookup, polled as tightly as vLLM's scheduler would: (ns, hit tokens)."""
    started = time.perf_counter_ns()
    lookups.scheduler.maybe_submit_lookup_request(request_id, pack(tokens))
    while (hit := lookups.scheduler.check_lookup_result(request_id)) is None:
        time.sleep(0.0001)
    elapsed = time.perf_counter_ns() - started
    lookups.end(request_id, tokens, int(hit))
    return elapsed, int(hit)


def measure(
    setting: str, redis_binary: str, prompts: int, chunks: int, rounds: int
) -> dict[str, Any]:
    workdir = short_tmpdir()
    gateway = Gateway(workdir, "4GiB")
    redis = RedisServer(workdir, redis_binary)
    server: LMCacheServer | None = None
    lookups: Client | None = None
    try:
        gateway.start()
        redis.start()
        server = start_server(setting, workdir, gateway, redis)
        bin_dir = server.bin_dir
        for seed in range(1, prompts + 1):
            code, report = client(bin_dir, server, "store", seed, "--chunks", str(chunks))
            if code != 0:
                raise RuntimeError(f"{setting}: the store of prompt {seed} failed: {report}")
        wait_until(server.l2_settled, 120, "the L2 stores to finish")
        lookups = Client(f"tcp://localhost:{server.port}", 30.0, "")
        count = chunks * lookups.chunk_tokens
        # The server needs the model's KV layout, which a worker's registration gives it.
        lookups.worker.register_kv_caches(kv_for(0, count // BLOCK_SIZE, fill=False))
        stored = [tokens_for(seed, count) for seed in range(1, prompts + 1)]
        never = [tokens_for(10_000 + seed, count) for seed in range(prompts)]
        result: dict[str, Any] = {"setting": setting, "prompts": prompts, "chunks": chunks}
        ids = itertools.count()
        for case, pool, expected in (("l1_hit", stored, count), ("miss", never, 0)):
            samples: list[int] = []
            wrong = 0
            for i in range(rounds + 20):  # the first 20 warm up
                elapsed, hit = timed_lookup(lookups, pool[i % prompts], f"bench-{next(ids)}")
                wrong += hit != expected
                if i >= 20:
                    samples.append(elapsed)
            result[case] = {**summarize(samples), "wrong_hits": wrong, "samples_ns": samples}
        return result
    finally:
        if lookups is not None:
            lookups.close(f"http://127.0.0.1:{server.http_port}" if server else None)
        for process in (server, redis, gateway):
            if process is not None:
                process.stop()
        remove_tree(workdir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--chunks", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench/results/two_adapters"))
    args = parser.parse_args()
    redis_binary = shutil.which("redis-server") or shutil.which("valkey-server")
    if redis_binary is None:
        raise SystemExit(
            "needs redis-server or valkey-server on PATH (apt-get install redis-server)"
        )
    passes = [
        [
            measure(setting, redis_binary, args.prompts, args.chunks, args.rounds)
            for setting in SETTINGS
        ]
        for _ in range(args.passes)
    ]
    pooled: dict[str, dict[str, Any]] = {}
    for setting in SETTINGS:
        runs = [r for one in passes for r in one if r["setting"] == setting]
        pooled[setting] = {
            case: {
                **summarize([ns for r in runs for ns in r[case]["samples_ns"]]),
                "wrong_hits": sum(r[case]["wrong_hits"] for r in runs),
                "p50_us_per_pass": [r[case]["p50_us"] for r in runs],
            }
            for case in ("l1_hit", "miss")
        }
    for one in passes:
        for r in one:
            for case in ("l1_hit", "miss"):
                del r[case]["samples_ns"]
    report = {
        "command": " ".join(["python -m bench.two_adapters", *sys.argv[1:]]),
        "redis": redis_binary,
        "prompts": args.prompts,
        "chunks": args.chunks,
        "rounds": args.rounds,
        "pooled": pooled,
        "passes": passes,
    }
    write_result(args.out.with_suffix(""), "two_adapters", report)
    print(markdown(report))


def markdown(report: dict[str, Any]) -> str:
    """Per setting, the pooled p50 / p90 / p99 of a lookup of a prompt in L1 and of a miss."""
    lines = [
        f"{report['prompts']} prompts of {report['chunks']} chunks; each sample one vLLM-style "
        f"lookup from submit to the answer, {report['rounds']} per case, setting and pass, the "
        f"settings taking turns over {len(report['passes'])} passes (pooled below). Redis: "
        f"`{report['redis']}`.",
        "",
        "| setting | lookup of a prompt in L1: p50 / p90 / p99 ms | of a prompt never stored: "
        "p50 / p90 / p99 ms | wrong hits |",
        "|---|---|---|---|",
    ]
    for setting, cases in report["pooled"].items():
        shown = [
            " / ".join(f"{cases[case][f'{p}_us'] / 1e3:.2f}" for p in ("p50", "p90", "p99"))
            for case in ("l1_hit", "miss")
        ]
        wrong = sum(cases[case]["wrong_hits"] for case in ("l1_hit", "miss"))
        lines.append(
            f"| {SETTING_LABELS.get(setting, setting)} | {shown[0]} | {shown[1]} | {wrong} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
