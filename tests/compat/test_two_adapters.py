"""Goal: our adapter works next to LMCache's own Redis/Valkey adapter (`resp`, LMCache's C++
RESP client shipped in the wheel) in one ``lmcache server`` (two ``--l2-adapter``, ours first,
as configs/two-adapters.sh launches it), against a real Redis started by the test:

- a store reaches both: the gateway and Redis each hold every chunk;
- with L1 cleared the chunks come back from L2, loaded from ours (the first adapter holding
  them), byte-exact;
- with the gateway stopped they come back from Redis, and with Redis emptied and the gateway
  back they come back from ours: either adapter restores on its own.

Lookup latency with both adapters against ours alone is measured by bench/two_adapters.py.
Skipped when neither redis-server nor valkey-server is installed (Debian: redis-server).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import BIN, Gateway, wait_until
from tests.support.compat import RedisServer, TwoAdaptersServer, client, metric

REDIS = shutil.which("redis-server") or shutil.which("valkey-server")
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        REDIS is None,
        reason="needs redis-server or valkey-server on PATH (apt-get install redis-server)",
    ),
]
CHUNKS = 4


@pytest.fixture
def redis(workdir: Path) -> Iterator[RedisServer]:
    assert REDIS is not None
    server = RedisServer(workdir, REDIS).start()
    yield server
    server.kill()


@pytest.fixture
def server(workdir: Path, gateway: Gateway, redis: RedisServer) -> Iterator[TwoAdaptersServer]:
    made = TwoAdaptersServer(workdir, gateway.socket_path, redis.port)
    try:
        yield made.start()
    finally:
        made.kill()


def loads_by_adapter(server: TwoAdaptersServer) -> dict[str, float]:
    return metric(server, "lmcache_mp_l2_load_completed_requests_total")


def check_from_l2(server: TwoAdaptersServer) -> None:
    server.clear_l1()
    code, report = client(BIN, server, "check", 1, "--chunks", str(CHUNKS), "--expect-tier", "l2")
    assert code == 0, report


def test_stores_reach_both_and_either_adapter_restores(
    gateway: Gateway, redis: RedisServer, server: TwoAdaptersServer
) -> None:
    assert client(BIN, server, "store", 1, "--chunks", str(CHUNKS))[0] == 0
    wait_until(server.l2_settled, 60, "the L2 stores to finish")
    assert int(redis.command("DBSIZE")) == CHUNKS
    usage = metric(server, "lmcache_mp_l2_usage_bytes")
    assert usage["native_plugin"] == usage["resp"] > 0, usage

    check_from_l2(server)
    assert loads_by_adapter(server) == {"native_plugin": 1.0}  # ours is first, and holds them
    assert client(BIN, server, "check", 2, "--chunks", str(CHUNKS))[0] == 1  # never stored

    gateway.stop()
    check_from_l2(server)
    assert loads_by_adapter(server).get("resp") == 1.0  # Redis alone restored them

    assert redis.command("FLUSHALL") == "OK"
    mark = gateway.log().count("connected")
    gateway.start()
    wait_until(lambda: gateway.log().count("connected") > mark, 30, "the plugin to reconnect")
    check_from_l2(server)
    assert loads_by_adapter(server) == {"native_plugin": 2.0, "resp": 1.0}
