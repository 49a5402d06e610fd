"""Time to first token of a returning long prompt: restored from the gateway vs recomputed.

    .venv/bin/python -m bench.ttft_restore [--tokens 8192] [--layers 12] [--hidden 1024]

A random-weight Llama large enough that prefill costs real time on this CPU is built offline.
Each measurement runs in a fresh vLLM process with an empty LMCache L1 (max_tokens=1, so the
request time is the time to first token):
  1. recompute: vLLM without any KV connector;
  2. store: vLLM through LMCacheMPConnector -> lmcache server -> our plugin -> gateway;
  3. restore: vLLM, the lmcache server and the gateway all restarted, then the same prompt.
Writes OUT.json and OUT.md (``--out``). Needs .venv-e2e (scripts/setup-e2e.sh).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.results import write as write_result
from tests.support import Gateway, LMCacheServer, remove_tree, short_tmpdir, wait_until
from tests.support.e2e_stack import E2E_BIN, ENV, HERE, Vllm


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--out", type=Path, default=Path("bench/results/ttft_restore"))
    args = parser.parse_args()
    work = short_tmpdir()
    try:
        result = measure(work, args)
    finally:
        remove_tree(work)
    report = {"command": " ".join(["python -m bench.ttft_restore", *sys.argv[1:]]), **result}
    write_result(args.out.with_suffix(""), "ttft_restore", report)
    print(markdown(report))
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


def markdown(report: dict[str, Any]) -> str:
    """The times to first token, recomputed and restored, and the server's log of the restore."""
    model = report["model"]
    runs = [("this run", report)]
    if "earlier_run_same_command" in report:  # kept from the first run, same command and day
        runs.append(("an earlier run of the same command", report["earlier_run_same_command"]))
    lines = [
        f"A random-weight Llama ({model['layers']} layers, hidden {model['hidden']}, "
        f"{model['heads']} heads, {model['dtype']}: {report['kv_bytes_per_token']:,} bytes of KV "
        f"per token, {report['kv_bytes_of_prompt'] / 1e6:.0f} MB for the "
        f"{report['prompt_tokens']:,}-token prompt), real vLLM through `LMCacheMPConnector`. Each "
        "time to first token in a fresh vLLM process; the restore after vLLM, the lmcache server "
        "and the gateway all restarted (L1 empty, the gateway reading by O_DIRECT).",
        "",
        "| run | recompute s | first run through the connector s | restored s "
        "| tokens restored | speedup |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {label} | {r['ttft_recompute_s']:.1f} | {r['ttft_first_run_with_connector_s']:.1f} "
        f"| {r['ttft_restore_s']:.1f} | {r['tokens_restored']:,} | {r['speedup']}x |"
        for label, r in runs
    ]
    if report.get("server_log_restore"):
        lines += ["", "The lmcache server's log of the restore:", ""]
        lines += [f"- `{line}`" for line in report["server_log_restore"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
