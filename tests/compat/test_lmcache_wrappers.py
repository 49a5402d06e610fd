"""Goal: LMCache's own L2 wrappers work over our adapter in a real ``lmcache server`` (0.5.6),
with the settings docs/compatibility.md gives:

- ``fault_inject`` around our native_plugin spec fails exactly the loads it is told to, and
  the rest still come back from the gateway byte-exact;
- ``serde`` in our spec: ``fp8`` stores half the bytes and loads back the fp8 rounding of the
  KV; ``aesgcm`` stores ciphertext (not a multiple of 4 KiB long) and loads back every byte;
- serde and plain data share keys: a server without the serde finds the chunks one with fp8
  stored, and must not take them for its own (its loads miss, it never gets the fp8 bytes).

Each server's chunks are stored, the L2 writes waited for, L1 emptied (POST /cache/clear), and
the chunks loaded back from L2 through the gateway and compared.
"""

from __future__ import annotations

import json
import os
import re
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support import BIN, Gateway, LMCacheServer, wait_until
from tests.support.compat import client

pytestmark = pytest.mark.integration

CHUNKS = 4
CHUNK_BYTES = 2 * 4 * 256 * 4 * 64 * 2  # the client's K and V, 4 layers, 4 heads of 64, fp16


def with_serde(gateway: Gateway, serde: dict[str, Any]) -> str:
    spec = json.loads(gateway.l2_adapter_json())
    return json.dumps({**spec, "serde": serde})


def l2_usage_bytes(server: LMCacheServer) -> int:
    """What LMCache counts as stored in its L2 adapters (the bytes each store handed over)."""
    url = f"http://127.0.0.1:{server.http_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    values = re.findall(r"^lmcache_mp_l2_usage_bytes(?:{[^}]*})? (\S+)$", text, re.M)
    return int(sum(float(v) for v in values))


def gateway_counts(gateway: Gateway) -> dict[str, int]:
    """The gateway's work for every session that has ended, from its summary lines."""
    totals = dict.fromkeys(("loads", "load_hits", "stores", "looked_up", "found"), 0)
    pattern = (
        r"(\d+) loads \((\d+) hits, [^)]*\), (\d+) stores \([^)]*\), "
        r"(\d+) keys looked up \((\d+) found\)"
    )
    for match in re.finditer(pattern, gateway.log()):
        for name, value in zip(totals, match.groups(), strict=True):
            totals[name] += int(value)
    return totals


def store_then_clear(server: LMCacheServer, seed: int) -> None:
    assert client(BIN, server, "store", seed, "--chunks", str(CHUNKS))[0] == 0
    wait_until(server.l2_settled, 60, "the L2 stores to finish")
    server.clear_l1()


def check(server: LMCacheServer, seed: int, *extra: str) -> tuple[int, dict[str, Any]]:
    return client(BIN, server, "check", seed, "--chunks", str(CHUNKS), *extra)


def test_fault_inject_fails_the_loads_it_picks_and_the_rest_load_exact(
    gateway: Gateway, make_server: Callable[[str], LMCacheServer]
) -> None:
    spec = json.dumps(
        {"type": "fault_inject", "inner": json.loads(gateway.l2_adapter_json()), "gap_indices": [2]}
    )
    server = make_server(spec).start()
    assert "FaultInjectL2Adapter ACTIVE" in server.log()
    store_then_clear(server, 1)
    code, report = check(server, 1)
    assert code == 1  # a partial hit: the load of the third chunk was failed by the wrapper
    assert report["hit_tokens"] == 2 * 256, report  # the prefix before the gap
    assert report["identical"] and report["l2_loaded_chunks"] >= 2, report
    server.stop()
    counts = gateway_counts(gateway)
    print(counts)
    assert counts["load_hits"] >= 3, counts  # the gateway served the chunk the wrapper failed


def test_fp8_serde_stores_half_the_bytes_loads_the_fp8_rounding_and_shares_keys(
    gateway: Gateway, make_server: Callable[[str], LMCacheServer]
) -> None:
    spec = with_serde(gateway, {"type": "fp8", "fp8_dtype": "float8_e4m3fn", "max_workers": 1})
    fp8 = make_server(spec).start()
    store_then_clear(fp8, 1)
    assert l2_usage_bytes(fp8) == CHUNKS * CHUNK_BYTES // 2
    code, report = check(fp8, 1, "--expect-fp8", "--expect-tier", "l2")
    assert code == 0, report
    assert report["identical_to_fp8"] and not report["identical"], report  # lossy, as documented
    assert check(fp8, 2)[0] == 1  # never stored: a miss
    fp8.stop()

    # The same keys without the serde: the server finds the fp8 chunks, and their loads miss
    # (the gateway holds 512 KiB objects where this server asks for 1 MiB): it recomputes.
    plain = make_server(gateway.l2_adapter_json()).start()
    code, report = check(plain, 1)
    assert code == 1 and report["hit_tokens"] == 0, report
    plain.stop()
    counts = gateway_counts(gateway)
    assert counts["found"] >= 2 * CHUNKS and counts["load_hits"] == CHUNKS, counts


def test_aesgcm_serde_stores_ciphertext_and_loads_every_byte(
    gateway: Gateway, make_server: Callable[[str], LMCacheServer], workdir: Path
) -> None:
    key = workdir / "master.key"
    key.write_bytes(os.urandom(32))
    key.chmod(0o600)
    serde = {"type": "aesgcm", "master_key_path": str(key), "aes_bits": 256}
    server = make_server(with_serde(gateway, serde)).start()
    store_then_clear(server, 1)
    framed = CHUNK_BYTES + 1 + 12 + 16  # version byte, IV, tag: not a multiple of 4 KiB
    assert l2_usage_bytes(server) == CHUNKS * framed
    code, report = check(server, 1, "--expect-tier", "l2")
    assert code == 0, report


def test_serde_formats_of_one_size_read_each_other_unless_tenants_keep_them_apart(
    gateway: Gateway, make_server: Callable[[str], LMCacheServer]
) -> None:
    """fp8 e4m3fn and e5m2 objects have the same length, so nothing tells them apart: a server
    decoding with the other format gets hits and wrong KV. A tenant per serde setting (the
    plugin's ``tenant``, a namespace in the gateway) keeps them apart: a miss instead."""
    e4m3 = make_server(with_serde(gateway, {"type": "fp8", "fp8_dtype": "float8_e4m3fn"})).start()
    store_then_clear(e4m3, 1)
    e4m3.stop()

    e5m2_spec = {"type": "fp8", "fp8_dtype": "float8_e5m2"}
    e5m2 = make_server(with_serde(gateway, e5m2_spec)).start()
    code, report = check(e5m2, 1, "--expect-fp8")
    assert code == 1 and report["hit_tokens"] == CHUNKS * 256, report  # every chunk a hit ...
    assert not report["identical_to_fp8"] and not report["identical"], report  # ... wrong KV
    e5m2.stop()

    apart = json.loads(gateway.l2_adapter_json(tenant="fp8-e5m2"))
    e5m2 = make_server(json.dumps({**apart, "serde": e5m2_spec})).start()
    code, report = check(e5m2, 1)
    assert code == 1 and report["hit_tokens"] == 0, report
