"""One vLLM (CPU) engine in this process; sends prompts of deterministic random token ids.

    python tests/support/run_vllm.py --model DIR [--lmcache-port P] [--seed S --len N --salt X]
    python tests/support/run_vllm.py --model DIR [--lmcache-port P] --stdin  # a JSON request a line

Without --lmcache-port, no KV connector. Each request prints one line
`E2E_RESULT {"prompt_len", "num_cached_tokens", "output_token_ids", "elapsed_s", ...}`;
start-up prints `E2E_READY {"startup_s"}`. vLLM's own prefix cache is reset before every request,
so num_cached_tokens counts only what came from LMCache.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")


def prompt_ids(seed: int, length: int, vocab: int = 1024) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, vocab) for _ in range(length)]  # 0-2: special tokens


def emit(tag: str, obj: dict) -> None:
    print(f"{tag} {json.dumps(obj)}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--lmcache-port", type=int, help="MP server port; omit for no connector")
    p.add_argument("--mq-timeout", type=float, default=30.0)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--len", type=int, default=2048)
    p.add_argument("--salt")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--stdin", action="store_true")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--kv-cache-mib", type=int, default=512, help="vLLM's KV cache, MiB")
    a = p.parse_args()

    from vllm import LLM, SamplingParams

    kwargs: dict = {}
    if a.lmcache_port:
        kwargs["kv_transfer_config"] = {
            "kv_connector": "LMCacheMPConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "lmcache.mp.host": "tcp://localhost",
                "lmcache.mp.port": a.lmcache_port,
                "lmcache.mp.mq_timeout": a.mq_timeout,
            },
        }
    t0 = time.monotonic()
    llm = LLM(
        model=a.model,
        dtype=a.dtype,
        enforce_eager=True,
        max_model_len=a.max_model_len,
        seed=0,
        # On CPU, gpu_memory_utilization is a fraction of the NUMA node's memory and start-up
        # fails when that much is not free; a fixed KV size skips that check.
        kv_cache_memory_bytes=a.kv_cache_mib << 20,
        **kwargs,
    )
    emit("E2E_READY", {"startup_s": round(time.monotonic() - t0, 2)})

    def run(seed: int, length: int, salt: str | None, max_tokens: int | None = None) -> None:
        llm.reset_prefix_cache()
        sampling = SamplingParams(
            temperature=0.0, max_tokens=max_tokens or a.max_tokens, ignore_eos=True
        )
        prompt: dict = {"prompt_token_ids": prompt_ids(seed, length)}
        if salt:
            prompt["cache_salt"] = salt
        t = time.monotonic()
        out = llm.generate([prompt], sampling, use_tqdm=False)[0]
        emit(
            "E2E_RESULT",
            {
                "seed": seed,
                "salt": salt,
                "prompt_len": len(out.prompt_token_ids or []),
                "num_cached_tokens": out.num_cached_tokens,
                "output_token_ids": list(out.outputs[0].token_ids),
                "elapsed_s": round(time.monotonic() - t, 3),
            },
        )

    if not a.stdin:
        run(a.seed, a.len, a.salt)
    else:
        for line in sys.stdin:
            if line.strip():
                r = json.loads(line)
                run(
                    int(r.get("seed", a.seed)),
                    int(r.get("len", a.len)),
                    r.get("salt"),
                    r.get("max_tokens"),
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
