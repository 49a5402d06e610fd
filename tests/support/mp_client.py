#!/usr/bin/env python3
"""Minimal CPU client for an LMCache multiprocess (MP) server.

Uses LMCache's own client stack, the same one ``lmcache bench server
--mode cpu`` uses: ``RequestClientFactory`` (ZMQ request client) plus
``EngineDrivenTransferContext`` (engine-driven gather/scatter of paged KV).

  python mp_client.py --port P store --seed 1   # store N chunks of seeded KV
  python mp_client.py --port P check --seed 1   # lookup + retrieve + compare

``check`` exits 0 only if every chunk hits and the retrieved KV is
byte-identical to what ``store`` wrote for the same seed; 1 otherwise.
Exit 2 on errors (server unreachable, RPC timeout), 3 on watchdog timeout.
With ``--http-port H`` check also reports how many hit tokens came from L1 vs
L2 (delta of the server's /metrics lookup_hit_{l1,l2} counters), and
``--expect-tier l1|l2`` makes check fail unless all hits came from that tier.
"""

import argparse
import os
import re
import sys
import threading
import time
import urllib.request

import torch
import zmq
from lmcache.utils import EngineType
from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey
from lmcache.v1.multiprocess.group_view import EngineGroupInfo
from lmcache.v1.multiprocess.transfer_context import EngineDrivenTransferContext
from lmcache.v1.multiprocess.transport.factory import RequestClientFactory

MODEL = "mp-client-test"
INSTANCE_ID = 4242
BLOCK_SIZE = 16  # tokens per paged block
NUM_LAYERS, NUM_HEADS, HEAD_SIZE = 4, 4, 64
DTYPE = torch.float16


def log(msg):
    print(f"[mp_client] {msg}", flush=True)


def make_tokens(seed, n):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(1, 32000, (n,), generator=g).tolist())


def make_kv(seed, num_blocks, fill=True):
    """vLLM NHD paged layout: one (2, NB, BS, NH, HS) tensor per layer."""
    shape = (2, num_blocks, BLOCK_SIZE, NUM_HEADS, HEAD_SIZE)
    if not fill:
        return {f"layer.{i}": torch.zeros(shape, dtype=DTYPE) for i in range(NUM_LAYERS)}
    g = torch.Generator().manual_seed(seed + 1_000_003)
    return {f"layer.{i}": torch.randn(shape, generator=g).to(DTYPE) for i in range(NUM_LAYERS)}


def tier_hits(http_url):
    """Cumulative lookup-hit tokens per tier from the server's /metrics."""
    with urllib.request.urlopen(f"{http_url}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    hits = {}
    for tier in ("l1", "l2"):
        pat = (
            rf"^lmcache_mp_lookup_hit_{tier}_tokens_total"
            rf'{{[^}}]*model_name="{MODEL}"[^}}]*}} (\S+)$'
        )
        hits[tier] = sum(float(v) for v in re.findall(pat, text, re.M))
    return hits


class MPClient:
    def __init__(self, url, num_chunks, timeout, cache_salt=""):
        self.cache_salt = cache_salt  # vLLM's per-user salt: part of every chunk's key
        self.timeout = timeout
        self.ctx = zmq.Context()
        self.ctx.setsockopt(zmq.LINGER, 0)
        self.client = RequestClientFactory.create(url, context=self.ctx)
        self.tc = None
        try:  # also serves as the connectivity probe
            self.chunk_size = int(self.client.get_chunk_size().result(timeout=timeout))
        except BaseException:
            self.close()
            raise
        assert self.chunk_size % BLOCK_SIZE == 0, self.chunk_size
        self.blocks_in_chunk = self.chunk_size // BLOCK_SIZE
        self.num_tokens = num_chunks * self.chunk_size
        self.block_ids = [list(range(num_chunks * self.blocks_in_chunk))]

    def register(self, kv):
        self.tc = EngineDrivenTransferContext(INSTANCE_ID, self.client)
        self.tc.register(
            kv,
            MODEL,
            1,
            self.blocks_in_chunk,
            self.timeout,
            layout_hints={"kv_layout": "NHD"},
            engine_group_infos=[EngineGroupInfo(0, tuple(range(NUM_LAYERS)), BLOCK_SIZE)],
            engine_type=EngineType.VLLM,
        )

    def key(self, tokens, request_id, end, worker_id=0):
        # num_kv_readers=1: one reader releases the read locks LOOKUP takes
        return IPCCacheServerKey(
            model_name=MODEL,
            world_size=1,
            worker_id=worker_id,
            token_ids=tokens,
            start=0,
            end=end,
            request_id=request_id,
            num_kv_readers=1,
            cache_salt=self.cache_salt,
        )

    def lookup(self, tokens, request_id):
        """LOOKUP + poll QUERY_PREFETCH_STATUS; returns number of hit chunks."""
        key = self.key(tokens, request_id, len(tokens), worker_id=None)  # as bench
        self.client.lookup(key, 1).result(timeout=self.timeout)
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            fut = self.client.query_prefetch_status(request_id)
            hit = fut.result(timeout=self.timeout)
            if hit is not None:
                return int(hit)
            time.sleep(0.05)
        raise TimeoutError("prefetch did not finish")

    def store(self, tokens, request_id, kv):
        fut = self.tc.submit_store(
            request_id,
            self.key(tokens, request_id, len(tokens)),
            kv,
            self.block_ids,
            None,
            self.blocks_in_chunk,
        )
        return bool(fut.result(timeout=self.timeout))

    def retrieve(self, tokens, request_id, kv, num_tokens):
        nblocks = num_tokens // BLOCK_SIZE
        fut = self.tc.submit_retrieve(
            request_id,
            self.key(tokens, request_id, num_tokens),
            kv,
            [self.block_ids[0][:nblocks]],
            None,
            self.blocks_in_chunk,
        )
        return bool(fut.result(timeout=self.timeout))

    def end_session(self, request_id):
        self.client.end_session(request_id).result(timeout=self.timeout)

    def close(self):
        if self.tc is not None:
            try:
                fut = self.tc.unregister()
                if fut is not None:
                    fut.result(timeout=self.timeout)
            except Exception as exc:  # best effort
                log(f"unregister failed: {exc!r}")
            self.tc.close()
        self.client.close()
        self.ctx.term()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="localhost")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=30.0, help="per-RPC timeout (s)")
    ap.add_argument("--deadline", type=float, default=120.0, help="hard limit (s)")
    ap.add_argument("--http-port", type=int, help="enables L1/L2 hit breakdown")
    ap.add_argument("action", choices=["store", "check"])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cache-salt", default="", help="vLLM's cache_salt for every key")
    ap.add_argument(
        "--expect-tier",
        choices=["l1", "l2"],
        help="check: require every hit to come from this tier (needs --http-port)",
    )
    args = ap.parse_args()

    # Watchdog: never hang a test run, whatever the transport does.
    wd = threading.Timer(args.deadline, lambda: (log("watchdog timeout"), os._exit(3)))
    wd.daemon = True
    wd.start()

    if args.expect_tier and not args.http_port:
        ap.error("--expect-tier needs --http-port")
    http = f"http://{args.host}:{args.http_port}" if args.http_port else None

    c = MPClient(f"tcp://{args.host}:{args.port}", args.chunks, args.timeout, args.cache_salt)
    rid = f"mp-client-{args.action}-{args.seed}-{os.getpid()}"
    try:
        tokens = make_tokens(args.seed, c.num_tokens)
        expected = make_kv(args.seed, len(c.block_ids[0]))
        if args.action == "store":
            c.register(expected)
            ok = c.store(tokens, rid, expected)
            c.end_session(rid)
            log(
                f"store: {'OK' if ok else 'FAILED'} ({c.num_tokens} tokens, "
                f"{args.chunks} chunks, chunk_size={c.chunk_size}, seed={args.seed})"
            )
            return 0 if ok else 1

        kv = make_kv(args.seed, len(c.block_ids[0]), fill=False)
        c.register(kv)
        before = tier_hits(http) if http else None
        hit_chunks = c.lookup(tokens, rid)
        hit_tokens = hit_chunks * c.chunk_size
        src, tier_ok = "", True
        if http:  # lookup metrics are published asynchronously: poll briefly
            deadline = time.monotonic() + 5
            while True:
                now = tier_hits(http)
                delta = {t: int(now[t] - before[t]) for t in now}
                if sum(delta.values()) >= hit_tokens or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            src = f" [from L1: {delta['l1']}, from L2: {delta['l2']} tokens]"
            if args.expect_tier:
                tier_ok = delta[args.expect_tier] == hit_tokens
        log(
            f"lookup: {hit_tokens}/{c.num_tokens} tokens hit "
            f"({hit_chunks}/{args.chunks} chunks){src}"
        )
        ok = hit_tokens > 0 and c.retrieve(tokens, rid, kv, hit_tokens)
        c.end_session(rid)
        nb = hit_tokens // BLOCK_SIZE
        same = (
            ok
            and all(  # byte-level compare of the retrieved blocks
                torch.equal(kv[n][:, :nb].view(torch.uint8), expected[n][:, :nb].view(torch.uint8))
                for n in kv
            )
        )
        log(
            "retrieve: "
            + (
                "skipped (miss)"
                if not hit_tokens
                else f"{'OK' if ok else 'FAILED'}; byte-identical: {same}"
            )
        )
        why = [
            m
            for m, bad in [
                (f"partial/miss {hit_tokens}/{c.num_tokens}", hit_tokens != c.num_tokens),
                ("data mismatch", hit_tokens and not same),
                (f"hits not all from {args.expect_tier}", not tier_ok),
            ]
            if bad
        ]
        passed = not why
        log("check: " + ("PASS" if passed else "FAIL (" + "; ".join(why) + ")"))
        return 0 if passed else 1
    finally:
        c.close()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as exc:
        log(f"error: {exc!r}")
        sys.exit(2)
