"""Time to first token of a returning long prompt: restored from the gateway vs recomputed.

    .venv/bin/python -m bench.ttft_restore [--tokens 8192] [--layers 12] [--hidden 1024]

A random-weight Llama large enough that prefill costs real time on this CPU is built offline.
Each measurement runs in a fresh vLLM process with an empty LMCache L1 (max_tokens=1, so the
request time is the time to first token):
  1. recompute: vLLM without any KV connector;
  2. store: vLLM through LMCacheMPConnector -> lmcache server -> our plugin -> gateway;
  3. restore: vLLM, the lmcache server and the gateway all restarted, then the same prompt.
Writes bench/results/ttft_restore.json. Needs .venv-e2e (scripts/setup-e2e.sh).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.support import Gateway, LMCacheServer, remove_tree, short_tmpdir, wait_until
from tests.support.e2e_stack import E2E_BIN, ENV, HERE, Vllm


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--out", type=Path, default=Path("bench/results/ttft_restore.json"))
    args = parser.parse_args()
    work = short_tmpdir()
    try:
        result = measure(work, args)
    finally:
        remove_tree(work)
    args.out.write_text(json.dumps({"command": " ".join(sys.argv), **result}, indent=1))
    print(json.dumps(result, indent=1))
    return 0


def measure(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    model = work / "model"
    heads = args.hidden // 64
    subprocess.run(
        [
            str(E2E_BIN / "python"),
            str(HERE / "make_model.py"),
            str(model),
            "--layers",
            str(args.layers),
            "--hidden",
            str(args.hidden),
            "--heads",
            str(heads),
            "--max-len",
            str(args.tokens + 64),
        ],
        check=True,
        env=ENV,
        timeout=600,
    )
    kv_bytes_per_token = args.layers * 2 * args.hidden * 4  # K and V, float32
    kv_mib = kv_bytes_per_token * (args.tokens + 64) // 2**20 + 256
    flags = ("--max-model-len", str(args.tokens + 64), "--kv-cache-mib", str(kv_mib))

    def ttft(server: LMCacheServer | None, tag: str) -> dict[str, Any]:
        engine = Vllm(work, tag).start(model, server.port if server else None, *flags)
        try:
            return engine.request(7, length=args.tokens, max_tokens=1, timeout_s=1800)
        finally:
            engine.stop()

    recompute = ttft(None, "recompute")
    gateway = Gateway(work, "8GiB").start()
    l1_gb = max(2, 2 * kv_bytes_per_token * args.tokens // 2**30 + 1)
    server = LMCacheServer(work, gateway.l2_adapter_json(), "-1", bin_dir=E2E_BIN, l1_size_gb=l1_gb)
    try:
        server.start()
        stores = server.log().count("Stored ")
        store = ttft(server, "store")
        wait_until(lambda: server.log().count("Stored ") > stores, 300, "the store")
        wait_until(server.l2_settled, 300, "the L2 stores")
        time.sleep(0.5)
        wait_until(server.l2_settled, 300, "the L2 stores")
        server.stop()
        gateway.restart()  # the restore below reads from disk, by O_DIRECT
        server = LMCacheServer(
            work, gateway.l2_adapter_json(), "-2", bin_dir=E2E_BIN, l1_size_gb=l1_gb
        ).start()
        restore = ttft(server, "restore")
        restore_log = server.log()
    finally:
        server.kill()
        gateway.stop()
    assert restore["num_cached_tokens"] >= args.tokens - 1, restore
    assert restore["output_token_ids"] == recompute["output_token_ids"]
    return {
        "model": {"layers": args.layers, "hidden": args.hidden, "heads": heads, "dtype": "float32"},
        "prompt_tokens": args.tokens,
        "kv_bytes_per_token": kv_bytes_per_token,
        "kv_bytes_of_prompt": kv_bytes_per_token * args.tokens,
        "ttft_recompute_s": recompute["elapsed_s"],
        "ttft_first_run_with_connector_s": store["elapsed_s"],
        "ttft_restore_s": restore["elapsed_s"],
        "tokens_restored": restore["num_cached_tokens"],
        "restore_over_recompute": round(restore["elapsed_s"] / recompute["elapsed_s"], 3),
        "speedup": round(recompute["elapsed_s"] / restore["elapsed_s"], 1),
        # Where the restore's time goes, from the lmcache server's own log lines.
        "server_log_restore": [
            re.sub(r"\x1b\[[0-9;]*m", "", line).split("LMCache INFO:")[-1].strip()
            for line in restore_log.splitlines()
            if "Prefetch request completed" in line or "Retrieved" in line
        ],
    }


if __name__ == "__main__":
    sys.exit(main())
