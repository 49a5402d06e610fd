"""Store or verify objects through LMCache's own L2 adapter stack (factory + native_plugin wrapper).

    python -m tests.support.l2_roundtrip store|verify ADAPTER_JSON COUNT SIZE SEED

Each object gets its own seeded random bytes, so ``verify`` (exit 0 only if every object loads
byte-exact) catches swapped, stale or partial objects. Run ``store`` and ``verify`` in different
processes, with a gateway restart in between, to prove persistence across both.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from lmcache.cli.commands.bench.l2_adapter_bench.data import (
    create_l1_memory_desc,
    make_aligned_tensor,
    make_memory_objects,
    make_object_keys,
)
from lmcache.cli.commands.bench.l2_adapter_bench.runner import (
    _wait_load_finished,
    _wait_store_finished,
)
from lmcache.v1.distributed.l2_adapters import create_l2_adapter
from lmcache.v1.distributed.l2_adapters.config import parse_args_to_l2_adapters_config

TIMEOUT_S = 120.0


def main() -> int:
    action, spec, count, size, seed = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
    buffer = make_aligned_tensor(count * size, 4096)
    config = parse_args_to_l2_adapters_config(argparse.Namespace(l2_adapter=[spec]))
    adapter = create_l2_adapter(
        config.adapters[0], l1_memory_desc=create_l1_memory_desc(buffer, 4096)
    )
    try:
        keys = make_object_keys(count, model_name="roundtrip-model", key_offset=seed * 10_000)
        objects = make_memory_objects(buffer, count, size, 0)
        expected = [
            np.random.default_rng([seed, i]).integers(0, 256, size, dtype=np.uint8)
            for i in range(count)
        ]
        if action == "store":
            for obj, data in zip(objects, expected, strict=True):
                obj.raw_data.numpy()[:] = data
            task = adapter.submit_store_task(keys, objects)
            result = _wait_store_finished(adapter, [task], TIMEOUT_S).get(task)
            print(f"stored={result}")
            return 0 if result is not None and int(result) >= 0 else 1
        for obj in objects:
            obj.raw_data.zero_()
        task = adapter.submit_load_task(keys, objects)
        bitmap = _wait_load_finished(adapter, [task], TIMEOUT_S).get(task)
        loaded = bitmap.popcount() if bitmap is not None else 0
        exact = sum(
            np.array_equal(o.raw_data.numpy(), e) for o, e in zip(objects, expected, strict=True)
        )
        print(f"loaded={loaded}/{count} byte_exact={exact}/{count}")
        return 0 if loaded == count and exact == count else 1
    finally:
        adapter.close()


if __name__ == "__main__":
    sys.exit(main())
