"""One long prompt's KV, stored into or restored from a running ``lmcache server``, timed.

    python -m bench.long_restore_client --phase store|restore --rpc-url tcp://localhost:P \
        --mode cpu|gpu --tokens N --json-out FILE

The server is driven the way vLLM's ``LMCacheMPConnector`` drives it, through LMCache's own
``ServerBenchClient`` (the client of ``lmcache bench server``): REGISTER_KV_CACHE of a paged KV
cache (CUDA IPC on a GPU, POSIX shared memory on a CPU host), then LOOKUP / STORE / RETRIEVE in
``lmcache_driven`` mode. Adapted from the device recipe's ``restore_bench.py`` for one long
request instead of several short ones.

- ``store``: a cold LOOKUP (expects no hit), STORE of the whole prompt.
- ``restore`` (against a fresh server, empty L1): the prompt's blocks are zeroed, then LOOKUP
  (the server finds the chunks in L2 and prefetches them into L1; its poll answers once they
  are there) and RETRIEVE (L1 into the KV cache). The restore time is the two together. Then
  the server's L1 is cleared and the same restore runs again (``again``): into L1 pages that
  have been written before, as in a server that has run for a while.

CPU: with ``--cpu-pids server=PID,gateway=PID`` the client reads the user + system CPU seconds of
those processes and of itself (/proc/PID/stat, every thread) at the start and the end of each
timed section, and reports the difference (``cpu_s``); the store also reports its start
(``cpu_start``), so that the caller can end the server's and the gateway's count once the
write-through to L2 has settled.

The KV cache is regenerated from LMCache's fixed seed in both phases, so each phase digests the
prompt's blocks (xxh3 over their bytes) before it touches them; a restore is correct when the
digest after RETRIEVE equals that one (and the store phase's, which the caller compares).
With ``LMC_C10_SHIM`` set, the c10 shim (bench/gpu_lmc.py says why) is loaded before lmcache.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import xxhash

from bench.harness import cpu_seconds_of

BLOCK_TOKENS = 16
LOOKUP_TIMEOUT_S = 600.0


def kv_spec(tokens: int, layers: int, kv_heads: int, head_dim: int) -> str:
    """LMCache's --kvcache-shape-spec for a paged cache holding exactly ``tokens`` tokens."""
    return f"(2,{tokens // BLOCK_TOKENS},{BLOCK_TOKENS},{kv_heads},{head_dim}):bfloat16:{layers}"


def load_shim() -> None:
    shim = os.environ.get("LMC_C10_SHIM")
    if shim:
        ctypes.CDLL(shim, mode=ctypes.RTLD_GLOBAL)  # after torch: it needs libc10 loaded


def make_client(args: argparse.Namespace) -> Any:
    from lmcache.cli.commands.bench.server_bench.client import ServerBenchClient
    from lmcache.cli.commands.bench.server_bench.config import BenchConfig

    config = BenchConfig(
        rpc_url=args.rpc_url,
        http_url="",
        mode=args.mode,
        transfer_mode="lmcache_driven",
        tp_size=1,
        use_mla=False,
        num_tokens=args.tokens,  # the client prepends one token: tokens + 1, all full chunks
        kvcache_shape_spec=kv_spec(args.tokens, *map(int, args.kv_shape.split(","))),
        num_blocks=args.tokens // BLOCK_TOKENS,
        block_size=BLOCK_TOKENS,
    )
    return ServerBenchClient(config, lambda message: print(message, flush=True))


def block_views(client: Any, request: Any) -> list[torch.Tensor]:
    """The request's blocks in every layer's paged tensor (2, blocks, 16, heads, dim)."""
    blocks = request.num_full_tokens // BLOCK_TOKENS
    layers = client._workers[0].kv_caches.values()
    return [t.narrow(1, request.block_offset, blocks) for t in layers]


def digest(views: list[torch.Tensor]) -> str:
    hasher = xxhash.xxh3_64()
    for view in views:
        hasher.update(view.contiguous().cpu().view(torch.uint8).numpy().data)
    return hasher.hexdigest()


def cpu_now(args: argparse.Namespace) -> dict[str, float]:
    """CPU seconds so far of this client and of each process named in ``--cpu-pids``."""
    pids = {"client": os.getpid(), **args.cpu_pids}
    return dict(zip(pids, cpu_seconds_of(tuple(pids.values())), strict=True))


def cpu_since(args: argparse.Namespace, start: dict[str, float]) -> dict[str, float]:
    return {name: now - start[name] for name, now in cpu_now(args).items()}


def parse_pids(text: str) -> dict[str, int]:
    """``server=12,gateway=34`` as ``{"server": 12, "gateway": 34}``."""
    pairs = (item.partition("=") for item in text.split(",") if item)
    return {name: int(pid) for name, _, pid in pairs}


def synchronize(mode: str) -> None:
    if mode == "gpu":
        torch.cuda.synchronize()


def lookup(client: Any, request: Any) -> int | None:
    """LOOKUP, then poll the prefetch status every millisecond until it answers; its hits."""
    from lmcache.cli.commands.bench.server_bench import helpers

    rpc = client._req_client
    key = helpers._make_key(
        request.token_ids,
        request.request_id,
        start=0,
        end=request.num_full_tokens,
        world_size=client._kv_world_size,
    )
    if not helpers._send_lookup(rpc, key, tp_size=len(client._workers)):
        return None
    deadline = time.monotonic() + LOOKUP_TIMEOUT_S
    while time.monotonic() < deadline:
        hits = helpers._wait_for_result(rpc.query_prefetch_status(request.request_id))
        if hits is not helpers._TIMEOUT and hits is not None:
            return int(hits)
        time.sleep(0.001)
    return None


def store(client: Any, args: argparse.Namespace) -> dict[str, Any]:
    request = client.create_request(0, "long-store", "cold")
    views = block_views(client, request)
    result: dict[str, Any] = {"digest": digest(views), "chunks": request.total_chunks}
    result["bytes"] = sum(v.numel() * v.element_size() for v in views)
    result["cold_lookup_hits"] = lookup(client, request)
    result["cpu_start"] = cpu_now(args)
    started = time.perf_counter()
    stored = client.store(request, 0, request.num_full_tokens)
    result["store_s"] = time.perf_counter() - started
    result["cpu_s"] = cpu_since(args, result["cpu_start"])
    result["ok"] = bool(stored and stored.succeeded) and result["cold_lookup_hits"] == 0
    client.end_session(request)
    return result


def restore(client: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The restore into the new server's empty L1, then, once its L1 is cleared, the same
    restore again: the second lands in L1 pages that have held data before, as every restore
    of a long-running server does (``again``)."""
    first = restore_once(client, args, "long-restore")
    clear_l1(client)
    again = restore_once(client, args, "long-restore-again")
    return {**first, "again": again, "ok": first["ok"] and again["ok"]}


def restore_once(client: Any, args: argparse.Namespace, request_id: str) -> dict[str, Any]:
    request = client.create_request(0, request_id, "cold")
    views = block_views(client, request)
    expected = digest(views)
    for view in views:
        view.zero_()
    synchronize(args.mode)
    cpu_start = cpu_now(args)
    started = time.perf_counter()
    hits = lookup(client, request)
    looked_up = time.perf_counter()
    retrieved = client.retrieve(request, 0, (hits or 0) * request.chunk_size)
    synchronize(args.mode)
    finished = time.perf_counter()
    cpu_s = cpu_since(args, cpu_start)
    client.end_session(request)
    restored = digest(views)
    return {
        "bytes": sum(v.numel() * v.element_size() for v in views),
        "chunks": request.total_chunks,
        "hits": hits,
        "lookup_prefetch_s": looked_up - started,
        "retrieve_s": finished - looked_up,
        "restore_s": finished - started,
        "cpu_s": cpu_s,
        "digest": restored,
        "ok": hits == request.total_chunks
        and bool(retrieved and retrieved.succeeded)
        and restored == expected,
    }


def clear_l1(client: Any) -> None:
    """Empty the server's L1 (LMCache's own ``clear``; L2 keeps everything)."""
    from lmcache.cli.commands.bench.server_bench import helpers

    if helpers._wait_for_result(client._req_client.clear(False)) is helpers._TIMEOUT:
        raise RuntimeError("the server did not answer CLEAR")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--phase", choices=["store", "restore"], required=True)
    parser.add_argument("--rpc-url", required=True)
    parser.add_argument("--mode", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--tokens", type=int, required=True, help="a multiple of 256")
    parser.add_argument("--kv-shape", default="43,2,128", help="layers,kv_heads,head_dim")
    parser.add_argument("--json-out", type=Path, required=True)
    parser.add_argument(
        "--cpu-pids", type=parse_pids, default={}, help="name=PID,...: processes whose CPU to read"
    )
    args = parser.parse_args()
    load_shim()
    client = make_client(args)
    started = time.perf_counter()
    client.start()
    setup_s = time.perf_counter() - started
    try:
        result = (store if args.phase == "store" else restore)(client, args)
    finally:
        client.close()
    result["client_setup_s"] = setup_s
    args.json_out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
