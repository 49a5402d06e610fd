# mypy: disable-error-code="no-untyped-call"
"""Drive an lmcache server from a thread of the test process, through LMCache's own client classes.

The client is tests/support/mp_client.py's ``MPClient`` (LMCache's ZMQ request client and
engine-driven transfer context, as ``lmcache bench server --mode cpu`` uses them), run in a
thread instead of one process per call: driving eight servers then costs one import of torch and
LMCache rather than sixteen, on a 2-core machine. Each call opens its own client and closes it.
(mp_client.py is untyped, hence the mypy line above.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tests.support import LMCacheServer, wait_until
from tests.support.mp_client import MPClient, make_kv, make_tokens, tier_hits

RPC_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Loaded:
    """What a lookup and retrieve of one seed's chunks gave back."""

    tokens_hit: int
    tokens_asked: int
    byte_exact: bool  # the retrieved blocks equal what ``store`` wrote for the seed


def store(server: LMCacheServer, seed: int, chunks: int) -> None:
    """Store ``chunks`` chunks of the seed's KV into the server (its L1; L2 follows on its own)."""
    client = MPClient(f"tcp://localhost:{server.port}", chunks, RPC_TIMEOUT_S)
    request_id = f"many-clients-store-{seed}"
    try:
        kv = make_kv(seed, len(client.block_ids[0]))
        client.register(kv)
        assert client.store(make_tokens(seed, client.num_tokens), request_id, kv), (
            f"the store of seed {seed} into the server on port {server.port} failed"
        )
        client.end_session(request_id)
    finally:
        client.close()


def load(server: LMCacheServer, seed: int, chunks: int) -> Loaded:
    """Look up the seed's chunks and retrieve the hits; compare them byte for byte."""
    client = MPClient(f"tcp://localhost:{server.port}", chunks, RPC_TIMEOUT_S)
    request_id = f"many-clients-load-{seed}"
    try:
        tokens = make_tokens(seed, client.num_tokens)
        kv = make_kv(seed, len(client.block_ids[0]), fill=False)
        client.register(kv)
        tokens_hit = client.lookup(tokens, request_id) * client.chunk_size
        retrieved = tokens_hit > 0 and client.retrieve(tokens, request_id, kv, tokens_hit)
        client.end_session(request_id)
    finally:
        client.close()
    blocks = tokens_hit // (client.chunk_size // client.blocks_in_chunk)
    expected = make_kv(seed, len(client.block_ids[0]))
    same = all(
        torch.equal(
            kv[name][:, :blocks].view(torch.uint8), expected[name][:, :blocks].view(torch.uint8)
        )
        for name in kv
    )
    return Loaded(tokens_hit, client.num_tokens, bool(retrieved) and same)


def store_then_load_from_l2(server: LMCacheServer, seed: int, chunks: int) -> None:
    """Store, wait for the server's L2 writes, empty its L1, and load every chunk back from L2."""
    store(server, seed, chunks)
    wait_until(server.l2_settled, 120, f"the L2 stores of port {server.port} to finish")
    server.clear_l1()
    metrics_url = f"http://localhost:{server.http_port}"
    l2_before = tier_hits(metrics_url)["l2"]
    loaded = load(server, seed, chunks)
    assert loaded.tokens_hit == loaded.tokens_asked and loaded.byte_exact, (
        f"seed {seed} on port {server.port}: {loaded}"
    )
    wait_until(  # the server publishes its lookup metrics asynchronously
        lambda: tier_hits(metrics_url)["l2"] - l2_before >= loaded.tokens_hit,
        10,
        f"the hits of seed {seed} on port {server.port} to be counted as L2 hits",
    )


def l2_stores_in_flight(server: LMCacheServer) -> int:
    """L2 store tasks the server has handed to the plugin and not seen complete."""
    controller = server.status()["storage_manager"]["store_controller"]
    return int(controller["in_flight_task_count"])
