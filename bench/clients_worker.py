"""One client process of bench/clients.py: its own ADPConnector (the real plugin) on the gateway.

    python -m bench.clients_worker --socket PATH --op store|load --client C --objects K \\
        --object-bytes B --in-flight N

Client C works on its own keys (``bench.plugin.object_keys``, LMCache-shaped, ``K`` of them from
``C * K``); object ``j`` of it holds ``content(C, j)``, random bytes seeded by both. The worker
connects, prepares every buffer (stores: the contents; loads: touched empty buffers, so neither
page faults nor random-number generation are timed), prints ``ready`` and waits for a line on
stdin. Then it keeps ``N`` single-object batches in flight until every object is done, and prints
one JSON line: its start and end on the machine-wide monotonic clock (comparable between
processes), the objects that failed and, for loads, those whose bytes differ from the content.
"""

from __future__ import annotations

import argparse
import json
import select
import sys
import time
from collections.abc import Callable

import numpy as np

from bench.plugin import object_keys, wait_connected
from lmcache_adp import ADPConnector

Submit = Callable[[list[str], list[memoryview]], int]
OP_TIMEOUT_S = 120.0  # every client's in-flight objects queue behind the others' on one disk


def content(client: int, index: int, object_bytes: int) -> bytes:
    return np.random.default_rng([client, index]).bytes(object_bytes)


def run_ops(
    connector: ADPConnector, submit: Submit, keys: list[str], buffers: list[memoryview], depth: int
) -> list[str]:
    """Submit one object per batch, ``depth`` batches outstanding; returns the keys that failed."""
    todo = list(zip(keys, buffers, strict=True))
    todo.reverse()  # popped from the end: in key order
    outstanding: dict[int, str] = {}
    failed: list[str] = []
    deadline = time.monotonic() + OP_TIMEOUT_S * (len(keys) + 1)
    while todo or outstanding:
        while todo and len(outstanding) < depth:
            key, buffer = todo.pop()
            outstanding[submit([key], [buffer])] = key
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(outstanding)} ops did not complete")
        ready, _, _ = select.select([connector.event_fd()], [], [], 0.5)
        if ready:
            for future_id, ok, _, per_key in connector.drain_completions():
                key = outstanding.pop(future_id)
                if not (ok and per_key and per_key[0]):
                    failed.append(key)
    return failed


def buffers_for(args: argparse.Namespace) -> list[memoryview]:
    if args.op == "store":
        objects = [content(args.client, j, args.object_bytes) for j in range(args.objects)]
        return [memoryview(data) for data in objects]
    # Filled, not just allocated: every page is mapped before the clock starts.
    return [np.full(args.object_bytes, 0xFF, dtype=np.uint8).data for _ in range(args.objects)]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    keys = object_keys(args.objects, first=args.client * args.objects)
    connector = ADPConnector(socket_path=args.socket, op_timeout_s=OP_TIMEOUT_S)
    try:
        wait_connected(connector, 60)
        buffers = buffers_for(args)
        print("ready", flush=True)
        sys.stdin.readline()
        submit = connector.submit_batch_set if args.op == "store" else connector.submit_batch_get
        started = time.monotonic()
        failed = run_ops(connector, submit, keys, buffers, args.in_flight)
        ended = time.monotonic()
    finally:
        connector.close()
    report = {"started": started, "ended": ended, "failed": len(failed), "differ": 0}
    if args.op == "load":
        report["differ"] = sum(
            bytes(buffers[j]) != content(args.client, j, args.object_bytes)
            for j in range(args.objects)
            if keys[j] not in failed
        )
    print(json.dumps(report), flush=True)
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.clients_worker")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--op", choices=["store", "load"], required=True)
    parser.add_argument("--client", type=int, required=True)
    parser.add_argument("--objects", type=int, required=True)
    parser.add_argument("--object-bytes", type=int, required=True)
    parser.add_argument("--in-flight", type=int, default=4)
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
