"""vLLM's offline API against lmcache-adp: the same kv_transfer_config as `vllm serve`.

    python configs/vllm-offline-example.py MODEL [LMCACHE_PORT]

The settings the end-to-end tests needed on CPU are marked; on a GPU drop them.
"""

import sys

from vllm import LLM, SamplingParams

llm = LLM(
    model=sys.argv[1],
    kv_transfer_config={
        "kv_connector": "LMCacheMPConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "lmcache.mp.host": "tcp://localhost",
            "lmcache.mp.port": int(sys.argv[2]) if len(sys.argv) > 2 else 5555,
        },
    },
    enforce_eager=True,  # CPU: start-up in ~20 s instead of ~70 s
    dtype="float32",  # CPU with AMX: avoids a SIGILL on the first tiny forward pass
    kv_cache_memory_bytes=2 << 30,  # CPU: skip the free-memory check of gpu_memory_utilization
)
prompt = {"prompt": "A long shared system prompt ... " * 200, "cache_salt": "tenant-a-user-1"}
out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=32))[0]
print(f"{out.num_cached_tokens} of {len(out.prompt_token_ids or [])} prompt tokens from the cache")
