"""Helpers for tests that drive a real plugin (ADPConnector) against a real gateway."""

from __future__ import annotations

import numpy as np

from adp_wire import fragmenter
from adp_wire.checksum import key_hash
from lmcache_adp import ADPConnector
from tests.support import Gateway, session_resources, wait_for_future, wait_until


def objects(count: int, size: int, seed: int = 0) -> list[bytearray]:
    rng = np.random.default_rng(seed)
    return [bytearray(rng.integers(0, 256, size, dtype=np.uint8).tobytes()) for _ in range(count)]


def views(buffers: list[bytearray]) -> list[memoryview]:
    return [memoryview(b) for b in buffers]


def connected(connector: ADPConnector, timeout_s: float = 20) -> None:
    """Wait until an EXISTS is answered by the gateway (not failed for lack of it)."""

    def answered() -> bool:
        return bool(wait_for_future(connector, connector.submit_batch_exists(["probe"]))[1])

    wait_until(answered, timeout_s, "the plugin to reach the gateway")


def make_tenant_table(gateway: Gateway) -> None:
    """Store one object through a plugin that then leaves, so the gateway has made the tenant's
    presence table, which it keeps while the tenant holds a key, before a test counts the fds
    its sessions hold."""
    connector = ADPConnector(**gateway.adapter_params())
    try:
        connected(connector)
        stored = connector.submit_batch_set(["tenant-table"], [memoryview(bytearray(4096))])
        assert wait_for_future(connector, stored)[1], "the object that keeps the table"
    finally:
        connector.close()
    wait_until(lambda: session_resources(gateway)[1] == 0, 10, "the session's memory to be freed")


Objects = dict[str, bytes]


def keyed_objects(seed: int, count: int, size: int) -> Objects:
    """``count`` objects of ``size`` seeded bytes, by keys shaped as LMCache's."""
    rng = np.random.default_rng(seed)
    return {
        f"m@00000000@0@{seed:08x}{i:056x}": rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        for i in range(count)
    }


def databases_of(key: str, size: int, fragment_bytes: int = 2**20, databases: int = 2) -> set[int]:
    """The databases an object's fragments go to (the defaults: the fault tests' config)."""
    plan = fragmenter.plan(size, fragment_bytes, databases, key_hash("default", key))
    return {fragment.database for fragment in plan}
