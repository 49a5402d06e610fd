"""Drive the plugin the way LMCache does: submit a batch, then wait on its event fd and drain.

Used by the benchmarks that need the plugin outside LMCache's harness (EXISTS latency, restart
time): keys shaped like LMCache's, storing many small objects with several batches in flight,
and single batches waited on with ``tests.support.wait_for_future``.
"""

from __future__ import annotations

import select
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from lmcache_adp import ADPConnector
from tests.support import Gateway, wait_for_future, wait_until

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def object_keys(count: int, first: int = 0) -> list[str]:
    """Keys as LMCache's native_plugin bridge writes them: model@rank@group@chunk_hash_hex."""
    return [f"{MODEL}@00000000@0@{i:064x}" for i in range(first, first + count)]


def connect(gateway: Gateway, **params: Any) -> ADPConnector:
    return ADPConnector(**gateway.adapter_params(**params))


def exists(connector: ADPConnector, keys: list[str], timeout_s: float = 30) -> list[bool]:
    item = wait_for_future(connector, connector.submit_batch_exists(keys), timeout_s)
    return list(item[3] or [])


def wait_connected(connector: ADPConnector, timeout_s: float = 30) -> None:
    """Until an EXISTS is answered by the gateway (a failed one means no link yet)."""

    def answered() -> bool:
        item = wait_for_future(connector, connector.submit_batch_exists(["probe"]), timeout_s)
        return bool(item[1])

    wait_until(answered, timeout_s, "the plugin to reach the gateway")


def store_all(
    connector: ADPConnector,
    keys: Sequence[str],
    object_bytes: int,
    batch_keys: int = 1000,
    in_flight: int = 4,
    timeout_s: float = 600,
) -> dict[str, float]:
    """Store ``keys`` (``object_bytes`` each) in batches, ``in_flight`` batches outstanding.

    When a store fails (the link dropped, or admission control refused it), no new batch is
    sent; once the outstanding ones are done and the plugin is connected again, what is left
    is sent again. Raises after three passes in a row that stored nothing.
    """
    pool = np.random.default_rng(0).integers(0, 256, (256, object_bytes), dtype=np.uint8)
    views = [memoryview(row) for row in pool]  # read only by the plugin; shared by batches
    started = time.perf_counter()
    todo = list(keys)
    passes = resent = fruitless = 0
    while todo:
        if passes:
            wait_connected(connector)
            resent += len(todo)
        passes += 1
        left = _store_pass(connector, todo, views, batch_keys, in_flight, timeout_s)
        fruitless = fruitless + 1 if len(left) == len(todo) else 0
        if fruitless == 3:
            raise RuntimeError(f"{len(left)} of {len(keys)} stores failed three passes in a row")
        todo = left
    seconds = time.perf_counter() - started
    return {
        "objects": len(keys),
        "seconds": seconds,
        "objects_per_s": len(keys) / seconds,
        "passes": passes,
        "keys_sent_again": resent,
    }


def _store_pass(
    connector: ADPConnector,
    keys: list[str],
    views: list[memoryview],
    batch_keys: int,
    in_flight: int,
    timeout_s: float,
) -> list[str]:
    """Store ``keys`` until a store fails; returns the keys not stored (failed or not sent)."""
    batches = [keys[i : i + batch_keys] for i in range(0, len(keys), batch_keys)]
    outstanding: dict[int, list[str]] = {}
    failed: list[str] = []
    deadline = time.monotonic() + timeout_s
    while (batches and not failed) or outstanding:
        while batches and not failed and len(outstanding) < in_flight:
            batch = batches.pop(0)
            memviews = [views[i % len(views)] for i in range(len(batch))]
            outstanding[connector.submit_batch_set(batch, memviews)] = batch
        if time.monotonic() > deadline:
            raise TimeoutError(f"stores did not complete in {timeout_s} s")
        ready, _, _ = select.select([connector.event_fd()], [], [], 0.5)
        if not ready:
            continue
        for future_id, _, _, per_key in connector.drain_completions():
            batch = outstanding.pop(future_id)
            results = per_key or [False] * len(batch)
            failed += [k for k, ok in zip(batch, results, strict=True) if not ok]
    return failed + [key for batch in batches for key in batch]
