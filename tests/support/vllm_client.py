"""Store or check KV chunks through a running ``lmcache server`` the way vLLM does, on CPU.

    python -m tests.support.vllm_client --port P --http-port H store|check --seed S [--chunks N]

It drives the server with LMCache's own vLLM integration layer (``LMCacheMPSchedulerAdapter``
for lookups, ``LMCacheMPWorkerAdapter`` for stores and retrieves: what vLLM's
``LMCacheMPConnector`` calls), so it runs unchanged on every LMCache release whose adapters
keep vLLM's calling convention (0.5.4 to 0.5.7 here), in the venv of the server's release.

- ``store``: a lookup (must miss), then a store of N chunks of seeded KV; exits 0 once the
  worker reports the store finished.
- ``check``: the KV cache is zeroed, then a lookup (the server prefetches from L2 what L1 lacks)
  and a retrieve of the hit; compares every byte with what ``store`` wrote for that seed.

It prints one JSON line, {"action", "tokens", "hit_tokens", "ok", ...}, and exits 0 when the
action fully succeeded (store: the server holds every chunk afterwards; check: every token hit,
no load error, every byte equal, and with ``--expect-tier`` the chunks loaded from L2 meanwhile,
from the server's /metrics, are all of them (l2) or none (l1)), 1 when it did not, 2 on an
error, 3 when its watchdog fired.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
import urllib.request
from typing import Any

import lmcache.integration.vllm.vllm_multi_process_adapter as adapters
import torch
import zmq
from lmcache.integration.vllm.vllm_multi_process_adapter import (
    LMCacheMPSchedulerAdapter,
    LMCacheMPWorkerAdapter,
    LoadStoreOp,
    ParallelStrategy,
)

MODEL = "compat-client"
BLOCK_SIZE = 16  # vLLM's tokens per paged block
NUM_LAYERS, NUM_HEADS, HEAD_SIZE = 4, 4, 64
DTYPE = torch.float16


def _vllm_layout_hints(*_: Any) -> dict[str, str]:
    """What vLLM's CPU backend answers when LMCache asks for its KV layout (vLLM is not
    installed here). Its paged KV is HND; LMCache 0.5.4 assumes HND on CPU whatever the hint."""
    return {"kv_layout": "HND"}


adapters.vllm_layout_hints = _vllm_layout_hints


def pack(tokens: list[int]) -> Any:
    """Token ids as the adapters take them: a list up to 0.5.6; packed bytes from 0.5.7 on
    (LoadStoreOp.token_bytes, lmcache.v1.multiprocess.token_codec)."""
    if "token_bytes" not in getattr(LoadStoreOp, "__dataclass_fields__", {}):
        return tokens
    from lmcache.v1.multiprocess.token_codec import pack_token_ids

    return pack_token_ids(tokens)


def tokens_for(seed: int, count: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return [int(t) for t in torch.randint(1, 32000, (count,), generator=generator).tolist()]


def kv_for(seed: int, blocks: int, fill: bool = True) -> dict[str, torch.Tensor]:
    """vLLM's CPU paged layout (HND): one (2, blocks, heads, BLOCK_SIZE, head size) tensor a
    layer."""
    shape = (2, blocks, NUM_HEADS, BLOCK_SIZE, HEAD_SIZE)
    if not fill:
        return {f"layer.{i}": torch.zeros(shape, dtype=DTYPE) for i in range(NUM_LAYERS)}
    generator = torch.Generator().manual_seed(seed + 1_000_003)
    return {
        f"layer.{i}": torch.randn(shape, generator=generator).to(DTYPE) for i in range(NUM_LAYERS)
    }


def l2_loaded_chunks(http_url: str) -> int:
    """Chunks the server has loaded from L2 so far (its /metrics; every release has it)."""
    with urllib.request.urlopen(f"{http_url}/metrics", timeout=5) as response:
        text = response.read().decode()
    pattern = r"^lmcache_mp_l2_prefetch_load_completed_chunks_total(?:{[^}]*})? (\S+)$"
    return int(sum(float(v) for v in re.findall(pattern, text, re.M)))


def active_sessions(http_url: str) -> int:
    with urllib.request.urlopen(f"{http_url}/status", timeout=5) as response:
        return int(json.load(response).get("active_sessions", 0))


def wait_for(what: str, timeout_s: float, poll: Any) -> Any:
    """Call ``poll`` until it returns something other than None, within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = poll()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not finish in {timeout_s} s")
        time.sleep(0.02)


class Client:
    def __init__(self, url: str, timeout_s: float, cache_salt: str) -> None:
        self.timeout_s = timeout_s
        self.cache_salt = cache_salt
        self.context = zmq.Context()
        strategy = ParallelStrategy(
            mla_only=False, vllm_world_size=1, vllm_worker_id=0, tp_size=1, pp_size=1, n_servers=1
        )
        extra = {"lmcache.mp.mq_timeout": timeout_s}
        self.scheduler = LMCacheMPSchedulerAdapter(
            [url], self.context, MODEL, BLOCK_SIZE, strategy, extra_config=extra
        )
        self.worker = LMCacheMPWorkerAdapter(
            url, self.context, MODEL, BLOCK_SIZE, strategy, extra_config=extra
        )
        self.chunk_tokens = int(self.worker.num_blocks_per_chunk()) * BLOCK_SIZE

    def lookup(self, request_id: str, tokens: list[int]) -> int:
        self.scheduler.maybe_submit_lookup_request(
            request_id, pack(tokens), cache_salt=self.cache_salt
        )
        hit = wait_for(
            "the lookup", self.timeout_s, lambda: self.scheduler.check_lookup_result(request_id)
        )
        return int(hit)

    def transfer(self, kind: str, request_id: str, tokens: list[int], end: int) -> None:
        blocks = list(range(end // BLOCK_SIZE))
        op = LoadStoreOp(pack(tokens), [blocks], start=0, end=end)
        submit = (
            self.worker.submit_store_request
            if kind == "store"
            else self.worker.submit_retrieve_request
        )
        submit(request_id, op, None, cache_salt=self.cache_salt)
        slot = 0 if kind == "store" else 1  # get_finished: (stores done, retrieves done)

        def done() -> bool | None:
            finished = self.worker.get_finished({request_id})[slot]
            return True if finished and request_id in finished else None

        wait_for(f"the {kind}", self.timeout_s, done)

    def end(self, request_id: str, tokens: list[int], hit: int) -> None:
        if hit:
            self.scheduler.free_lookup_locks(
                pack(tokens), 0, hit, request_id, cache_salt=self.cache_salt
            )
        self.scheduler.cleanup_lookup_result(request_id)
        self.scheduler.end_session(request_id)

    def close(self, http_url: str | None) -> None:
        if http_url is not None:  # END_SESSION is not answered: let the server handle it
            # before the worker unregisters, or its handler fails to find the model's layout.
            deadline = time.monotonic() + 5
            while active_sessions(http_url) and time.monotonic() < deadline:
                time.sleep(0.02)
        self.worker.shutdown()
        self.scheduler.shutdown()
        self.context.destroy(linger=0)


def run(args: argparse.Namespace) -> dict[str, Any]:
    client = Client(f"tcp://{args.host}:{args.port}", args.timeout, args.cache_salt)
    http = f"http://{args.host}:{args.http_port}" if args.http_port else None
    try:
        count = args.chunks * client.chunk_tokens
        blocks = count // BLOCK_SIZE
        tokens = tokens_for(args.seed, count)
        expected = kv_for(args.seed, blocks)
        request_id = f"compat-{args.action}-{args.seed}-{os.getpid()}"
        result: dict[str, Any] = {"action": args.action, "tokens": count, "seed": args.seed}
        if args.action == "store":
            client.worker.register_kv_caches(expected)
            hit = client.lookup(request_id, tokens)
            client.transfer("store", request_id, tokens, count)
            client.end(request_id, tokens, hit)
            # The worker reports a failed store as finished too (0.5.4 only logs it): a second
            # lookup shows whether the server holds every chunk now.
            again = client.lookup(request_id + "-again", tokens)
            client.end(request_id + "-again", tokens, again)
            result.update(hit_tokens=hit, held_tokens=again, ok=again == count)
            return result
        kv = kv_for(args.seed, blocks, fill=False)
        client.worker.register_kv_caches(kv)
        before = l2_loaded_chunks(http) if http else None
        hit = client.lookup(request_id, tokens)
        if hit:
            client.transfer("retrieve", request_id, tokens, hit)
        errors = sorted(client.worker.get_block_ids_with_load_errors())
        client.end(request_id, tokens, hit)
        hit_blocks = hit // BLOCK_SIZE
        identical = all(
            torch.equal(
                kv[n][:, :hit_blocks].view(torch.uint8),
                expected[n][:, :hit_blocks].view(torch.uint8),
            )
            for n in kv
        )
        from_l2 = None
        if http is not None and before is not None:
            from_l2 = l2_loaded_chunks(http) - before
        tier_ok = (
            args.expect_tier is None
            or (args.expect_tier == "l2" and from_l2 == args.chunks)
            or (args.expect_tier == "l1" and from_l2 == 0)
        )
        result.update(
            hit_tokens=hit,
            load_error_blocks=len(errors),
            identical=identical,
            l2_loaded_chunks=from_l2,
            ok=hit == count and not errors and identical and tier_ok,
        )
        if args.expect_fp8:  # LMCache's fp8 serde: what comes back is the fp8 rounding
            rounded = {n: t.to(torch.float8_e4m3fn).to(DTYPE) for n, t in expected.items()}
            result["identical_to_fp8"] = all(
                torch.equal(kv[n][:, :hit_blocks], rounded[n][:, :hit_blocks]) for n in kv
            )
            result["ok"] = hit == count and not errors and result["identical_to_fp8"] and tier_ok
        return result
    finally:
        client.close(http)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="localhost")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--http-port", type=int, help="counts the chunks loaded from L2")
    parser.add_argument("--chunks", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=30.0, help="per step (s)")
    parser.add_argument("--deadline", type=float, default=120.0, help="the whole run (s)")
    parser.add_argument("--cache-salt", default="")
    parser.add_argument("--expect-tier", choices=["l1", "l2"])
    parser.add_argument(
        "--expect-fp8", action="store_true", help="check: compare with the fp8 rounding"
    )
    parser.add_argument("action", choices=["store", "check"])
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.expect_tier and not args.http_port:
        parser.error("--expect-tier needs --http-port")
    watchdog = threading.Timer(args.deadline, lambda: os._exit(3))
    watchdog.daemon = True
    watchdog.start()
    try:
        result = run(args)
    except Exception as error:
        print(json.dumps({"action": args.action, "error": repr(error)}), flush=True)
        return 2
    print(json.dumps(result), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
