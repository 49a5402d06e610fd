"""``adp-gateway verify``: prove on a running deployment that a prompt comes back from L2,
byte-exact, through a real ``lmcache server`` with our plugin.

It drives the server as vLLM does, through LMCache's own benchmark client (the one of
``lmcache bench server``, CPU mode): a synthetic prompt's KV cache is stored, written through to
L2, forced out of L1 (``POST /cache/clear``), then looked up (the server finds it in L2 and
loads it into L1) and retrieved into a zeroed KV cache, whose per-chunk digests must equal the
ones taken before the store. It needs ``lmcache`` importable (it is, wherever the plugin runs).
"""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from adp_gateway.errors import StartupError
from adp_wire.units import format_size

BLOCK_TOKENS = 16
LAYERS, KV_HEADS, HEAD_DIM = 8, 8, 128
BYTES_PER_TOKEN = 2 * LAYERS * KV_HEADS * HEAD_DIM * 2  # K and V, bfloat16


@dataclass(frozen=True)
class VerifyReport:
    tokens: int
    chunks: int
    chunks_from_l2: int
    restore_s: float
    byte_exact: bool

    def summary(self) -> str:
        size = format_size(self.tokens * BYTES_PER_TOKEN)
        if self.chunks_from_l2 < self.chunks:
            verdict = "NOT RESTORED: chunks missing from L2"
        else:
            verdict = "byte-exact" if self.byte_exact else "MISMATCH: what came back differs"
        return (
            f"verify: {self.tokens} tokens ({size}, {self.chunks} chunks) stored, evicted from "
            f"L1, restored with {self.chunks_from_l2} of {self.chunks} chunks from L2 in "
            f"{self.restore_s:.2f} s: {verdict}"
        )


def verify(rpc_url: str, http_url: str | None, tokens: int, timeout_s: float) -> VerifyReport:
    http = http_url or _default_http(rpc_url)
    client = _client(rpc_url, http, tokens)
    try:
        client.start()
    except Exception as exc:
        raise StartupError(f"cannot reach lmcache server at {rpc_url}: {exc}") from exc
    try:
        return _round_trip(client, http, timeout_s)
    finally:
        client.close()


def _round_trip(client: Any, http: str, timeout_s: float) -> VerifyReport:
    sequence = int(time.time() * 1000) % 2**31  # new tokens every run: nothing cached yet
    stored = client.create_request(sequence, f"adp-verify-store-{sequence}", "verify")
    length = stored.num_full_tokens
    before = client.compute_checksums(stored, 0, length)
    done = client.store(stored, 0, length)
    client.end_session(stored)
    if done is None or not done.succeeded:
        raise StartupError("lmcache server did not take the store")
    _wait_l2_settled(http, timeout_s)
    _post(f"{http}/cache/clear")
    restored = client.create_request(sequence, f"adp-verify-restore-{sequence}", "verify")
    client.zero_destination(restored, 0, length)
    started = time.perf_counter()
    found = client.lookup(restored)
    if found.hit_chunks:
        client.retrieve(restored, 0, found.hit_chunks * restored.chunk_size)
    restore_s = time.perf_counter() - started
    after = client.compute_checksums(restored, 0, length)
    client.end_session(restored)
    return VerifyReport(
        tokens=length,
        chunks=restored.total_chunks,
        chunks_from_l2=found.hit_chunks,
        restore_s=restore_s,
        byte_exact=found.hit_chunks == restored.total_chunks and before == after,
    )


def _client(rpc_url: str, http: str, tokens: int) -> Any:
    from lmcache.cli.commands.bench.server_bench.client import ServerBenchClient
    from lmcache.cli.commands.bench.server_bench.config import BenchConfig

    blocks = -(-tokens // BLOCK_TOKENS)
    config = BenchConfig(
        rpc_url=rpc_url,
        http_url=http,
        mode="cpu",
        transfer_mode="auto",
        tp_size=1,
        use_mla=False,
        num_tokens=tokens - 1,  # the client prepends one token
        kvcache_shape_spec=f"(2,{blocks},{BLOCK_TOKENS},{KV_HEADS},{HEAD_DIM}):bfloat16:{LAYERS}",
        num_blocks=blocks,
        block_size=BLOCK_TOKENS,
    )
    return ServerBenchClient(config, lambda message: None)


def _wait_l2_settled(http: str, timeout_s: float) -> None:
    """Until the server has no L2 store waiting or in flight."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{http}/status", timeout=5) as response:
                controller = json.load(response)["storage_manager"]["store_controller"]
            waiting = int(controller["pending_keys_count"]) + int(
                controller["in_flight_task_count"]
            )
        except (OSError, KeyError, TypeError, ValueError) as exc:  # URLError is an OSError
            raise StartupError(
                f"cannot read the server's L2 state at {http}/status ({exc}): check --http"
            ) from exc
        if waiting == 0:
            return
        time.sleep(0.1)
    raise StartupError(f"the server's L2 stores did not finish in {timeout_s:.0f} s")


def _post(url: str) -> None:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=30):
            pass
    except OSError as exc:  # URLError, HTTPError, a timeout
        raise StartupError(f"cannot POST {url} ({exc}): check --http") from exc


def _default_http(rpc_url: str) -> str:
    host = urllib.parse.urlparse(rpc_url.replace("tcp://", "http://")).hostname or "localhost"
    return f"http://{host}:8080"
