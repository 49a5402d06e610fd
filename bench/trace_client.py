"""A trace's requests sent to a running ``lmcache server`` as vLLM sends them through LMCache's
``LMCacheMPConnector``: for each request, LOOKUP of the prompt's chunks (the server checks L1,
then asks its L2 adapters and prefetches the prefix they hold), RETRIEVE of the prefix that hit
into the paged KV cache, STORE of the whole prompt (the server keeps what it lacks and writes it
through to L2), END_SESSION. One trace block is one LMCache chunk; a block's tokens are fixed by
its id, so requests that share leading blocks share those chunks' keys, as the trace's requests
share their prefixes.

Uses LMCache's own client stack (the ZMQ request client and ``EngineDrivenTransferContext``), as
tests/support/mp_client.py does, with a KV cache of ``LAYERS`` layers of ``HEADS`` heads of
``HEAD_SIZE`` in fp16: 4 KiB per token, so a chunk of 16 tokens is 64 KiB.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
import zmq
from lmcache.utils import EngineType
from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey
from lmcache.v1.multiprocess.group_view import EngineGroupInfo
from lmcache.v1.multiprocess.transfer_context import EngineDrivenTransferContext
from lmcache.v1.multiprocess.transport.factory import RequestClientFactory

MODEL = "trace-replay"
INSTANCE_ID = 4343
PAGE_TOKENS = 16  # tokens per paged block of the KV cache
LAYERS, HEADS, HEAD_SIZE = 4, 4, 64
BYTES_PER_TOKEN = 2 * LAYERS * HEADS * HEAD_SIZE * 2  # K and V, fp16
POLL_S = 0.001


def chunk_bytes(chunk_tokens: int) -> int:
    return chunk_tokens * BYTES_PER_TOKEN


class ReplayClient:
    def __init__(self, url: str, blocks_max: int, timeout_s: float) -> None:
        """Connects and registers a KV cache that holds a prompt of ``blocks_max`` chunks."""
        self.timeout_s = timeout_s
        self._context = zmq.Context()
        self._context.setsockopt(zmq.LINGER, 0)
        self._client = RequestClientFactory.create(url, context=self._context)
        self._transfer: Any = None
        try:
            self.chunk_tokens = int(self._client.get_chunk_size().result(timeout=timeout_s))
            assert self.chunk_tokens % PAGE_TOKENS == 0, self.chunk_tokens
            self._pages_per_chunk = self.chunk_tokens // PAGE_TOKENS
            pages = blocks_max * self._pages_per_chunk
            shape = (2, pages, PAGE_TOKENS, HEADS, HEAD_SIZE)
            generator = torch.Generator().manual_seed(7)
            self._kv = {
                f"layer.{i}": torch.randn(shape, generator=generator).to(torch.float16)
                for i in range(LAYERS)
            }
            self._pages = list(range(pages))
            self._transfer = EngineDrivenTransferContext(INSTANCE_ID, self._client)
            self._transfer.register(
                self._kv,
                MODEL,
                1,
                self._pages_per_chunk,
                timeout_s,
                layout_hints={"kv_layout": "NHD"},
                engine_group_infos=[EngineGroupInfo(0, tuple(range(LAYERS)), PAGE_TOKENS)],
                engine_type=EngineType.VLLM,
            )
        except BaseException:
            self.close()
            raise
        self._tokens: dict[int, tuple[int, ...]] = {}

    def request(self, request_id: str, blocks: list[int]) -> int:
        """One request: its hit chunks (from L1 or L2) loaded, the whole prompt stored. Returns
        how many leading chunks hit. Raises TimeoutError or RuntimeError when the server fails
        a step."""
        tokens = tuple(t for block in blocks for t in self._block_tokens(block))
        hits = self._lookup(tokens, request_id)
        if hits and not self._retrieve(tokens, request_id, hits * self.chunk_tokens):
            raise RuntimeError(f"RETRIEVE of {hits} chunks of {request_id} failed")
        if not self._store(tokens, request_id):
            raise RuntimeError(f"STORE of {request_id} failed")
        self._client.end_session(request_id).result(timeout=self.timeout_s)
        return hits

    def _block_tokens(self, block: int) -> tuple[int, ...]:
        """The block's tokens: fixed by its id (keys are hashes of the tokens up to a chunk)."""
        found = self._tokens.get(block)
        if found is None:
            rng = np.random.default_rng(block)
            found = tuple(int(t) for t in rng.integers(1, 32000, self.chunk_tokens))
            self._tokens[block] = found
        return found

    def _key(
        self, tokens: tuple[int, ...], request_id: str, end: int, worker_id: int | None = 0
    ) -> IPCCacheServerKey:
        """``worker_id`` None for a LOOKUP, which asks for every worker (as LMCache's bench)."""
        return IPCCacheServerKey(
            model_name=MODEL,
            world_size=1,
            worker_id=worker_id,
            token_ids=tokens,
            start=0,
            end=end,
            request_id=request_id,
            num_kv_readers=1,
            cache_salt="",
        )

    def _lookup(self, tokens: tuple[int, ...], request_id: str) -> int:
        key = self._key(tokens, request_id, len(tokens), worker_id=None)
        self._client.lookup(key, 1).result(timeout=self.timeout_s)
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            hits = self._client.query_prefetch_status(request_id).result(timeout=self.timeout_s)
            if hits is not None:
                return int(hits)
            time.sleep(POLL_S)
        raise TimeoutError(f"the prefetch of {request_id} did not finish in {self.timeout_s} s")

    def _retrieve(self, tokens: tuple[int, ...], request_id: str, hit_tokens: int) -> bool:
        pages = hit_tokens // PAGE_TOKENS
        future = self._transfer.submit_retrieve(
            request_id,
            self._key(tokens, request_id, hit_tokens),
            self._kv,
            [self._pages[:pages]],
            None,
            self._pages_per_chunk,
        )
        return bool(future.result(timeout=self.timeout_s))

    def _store(self, tokens: tuple[int, ...], request_id: str) -> bool:
        pages = len(tokens) // PAGE_TOKENS
        future = self._transfer.submit_store(
            request_id,
            self._key(tokens, request_id, len(tokens)),
            self._kv,
            [self._pages[:pages]],
            None,
            self._pages_per_chunk,
        )
        return bool(future.result(timeout=self.timeout_s))

    def close(self) -> None:
        if self._transfer is not None:
            try:
                future = self._transfer.unregister()
                if future is not None:
                    future.result(timeout=self.timeout_s)
            finally:
                self._transfer.close()
        self._client.close()
        self._context.term()
