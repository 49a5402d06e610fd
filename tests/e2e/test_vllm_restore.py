"""Goal: a returning prompt is restored from the gateway instead of recomputed, as a vLLM user
lives it: real vLLM (CPU) with the stock LMCacheMPConnector, the stock `lmcache server`, our
plugin and gateway; after vLLM, LMCache and the gateway all restarted; keyed by cache_salt; and
with the gateway gone or hung, where requests still complete correctly."""

from __future__ import annotations

import os
import re
import signal

import pytest

from tests.support import Gateway, LMCacheServer, wait_until
from tests.support.e2e_stack import Stack

pytestmark = pytest.mark.e2e
PROMPT_TOKENS = 2048
CHUNKS = PROMPT_TOKENS // 256


def stored_in_l2(server: LMCacheServer, stores_before: int) -> None:
    """Wait until vLLM's store reached the server and every L2 write finished.

    vLLM stores asynchronously, so an idle store controller right after a request proves
    nothing; the server logs "Stored N tokens" once the KV is in L1 and queued for L2."""
    wait_until(lambda: server.log().count("Stored ") > stores_before, 60, "the store")
    for _ in range(2):  # keys taken by the store loop may not be counted in flight yet
        wait_until(server.l2_settled, 60, "the L2 stores")


def served_from_gateway(gateway: Gateway) -> int:
    """Loads that hit, from the session summaries the gateway logs when a client leaves."""
    return sum(int(n) for n in re.findall(r"closed: \d+ loads \((\d+) hits", gateway.log()))


def hit(result: dict[str, object]) -> bool:
    return int(result["num_cached_tokens"]) >= int(result["prompt_len"]) - 1  # type: ignore[call-overload]


def zero_copy_stores(gateway: Gateway) -> int:
    """Stores that went from L1 to the disk with no copy, from the session summaries."""
    return sum(int(n) for n in re.findall(r"(\d+) of the stores zero-copy", gateway.log()))


@pytest.mark.parametrize("shared_l1", [True, False], ids=["l1-shared-zero-copy", "l1-private"])
def test_prompt_is_restored_after_vllm_lmcache_and_gateway_restart(
    stack: Stack, cold_outputs: dict[int, list[int]], shared_l1: bool
) -> None:
    """With L1 in shared memory (the launchers' default: stores zero-copy) and in private
    memory (the copy path)."""
    gateway = stack.gateway()
    server = stack.server(gateway, shared_l1)
    engine = stack.vllm(server)
    stores = server.log().count("Stored ")
    first = engine.request(1)
    assert first["num_cached_tokens"] == 0 and first["output_token_ids"] == cold_outputs[1]
    stored_in_l2(server, stores)
    engine.stop()
    assert server.stop() in (0, 130)  # L1 is gone with it
    wait_until(lambda: "of the stores zero-copy" in gateway.log(), 30, "the session's summary")
    assert zero_copy_stores(gateway) == (CHUNKS if shared_l1 else 0)
    gateway.restart()
    assert f"recovered {CHUNKS} objects" in gateway.log()

    server = stack.server(gateway, shared_l1)
    engine = stack.vllm(server)
    again = engine.request(1)
    assert again["prompt_len"] == PROMPT_TOKENS
    assert hit(again), again
    assert again["output_token_ids"] == cold_outputs[1]
    assert f"(0 L1, {CHUNKS} L2)" in server.log()
    engine.stop()
    server.stop()
    wait_until(lambda: served_from_gateway(gateway) >= CHUNKS, 30, "the gateway's summary")


def test_cache_salt_separates_users(stack: Stack, cold_outputs: dict[int, list[int]]) -> None:
    gateway = stack.gateway()
    server = stack.server(gateway)
    engine = stack.vllm(server)
    stores = server.log().count("Stored ")
    engine.request(2, salt="alice")
    stored_in_l2(server, stores)
    server.clear_l1()  # every hit below must come from the gateway
    assert engine.request(2, salt="bob")["num_cached_tokens"] == 0
    assert engine.request(2)["num_cached_tokens"] == 0
    server.clear_l1()
    same = engine.request(2, salt="alice")
    assert hit(same) and same["output_token_ids"] == cold_outputs[2]


def test_gateway_down_or_hung_while_serving(
    stack: Stack, cold_outputs: dict[int, list[int]]
) -> None:
    gateway = stack.gateway()
    server = stack.server(gateway, op_timeout_s=2.0, reconnect_interval_s=0.2)
    engine = stack.vllm(server)
    stores = server.log().count("Stored ")
    engine.request(3)
    stored_in_l2(server, stores)

    gateway.stop()
    server.clear_l1()
    down = engine.request(3)  # in the gateway, but the gateway is gone: recomputed
    assert down["num_cached_tokens"] == 0 and down["output_token_ids"] == cold_outputs[3]
    assert engine.request(4)["output_token_ids"] == cold_outputs[4]
    connections = gateway.log().count(" connected")
    gateway.start()
    wait_until(lambda: gateway.log().count(" connected") > connections, 30, "a reconnect")
    server.clear_l1()
    back = engine.request(3)
    assert hit(back) and back["output_token_ids"] == cold_outputs[3]

    assert gateway.proc is not None
    server.clear_l1()
    os.kill(gateway.proc.pid, signal.SIGSTOP)
    try:
        hung = engine.request(3, timeout_s=60)  # every L2 op expires after op_timeout_s
        assert hung["num_cached_tokens"] == 0 and hung["output_token_ids"] == cold_outputs[3]
    finally:
        os.kill(gateway.proc.pid, signal.SIGCONT)
    server.clear_l1()
    wait_until(lambda: hit(engine.request(3)), 60, "hits once the gateway resumes")


def test_nothing_the_test_started_is_left_behind(stack: Stack) -> None:
    gateway = stack.gateway()
    server = stack.server(gateway)
    engine = stack.vllm(server)
    engine.request(1)
    pids = [p.proc.pid for p in stack.processes if p.proc is not None]
    stack.stop_all()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)
    assert not list(gateway.socket_path.parent.glob("*.sock"))
