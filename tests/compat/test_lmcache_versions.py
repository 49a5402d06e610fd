"""Goal: the plugin works with every LMCache release it claims (plugin_manifest.yaml), each in
a venv of its own made on first use by scripts/setup-compat.sh (a few minutes per release, so
these tests are `slow`; CI runs 0.5.6, the release in .venv, through the rest of the suite):

- LMCache's own harnesses of that release pass against our adapter and a real gateway:
  ``basic_check --mode test_l2_adapter``, and ``lmcache bench l2 --no-skip-verify`` (aligned and
  unaligned buffers), and a ``bench l2 --only store`` whose keys a new process loads back after
  a gateway restart; so do objects of seeded bytes stored and verified byte for byte in two
  processes through that release's adapter stack (tests/support/l2_roundtrip.py);
- a real ``lmcache server`` of that release, with our plugin, stores KV chunks through the
  gateway, and after its L1 is cleared, and again after the server restarts, loads them back
  from L2 byte-exact; chunks never stored miss;
- the same chunks are hits from L2 for a server of the main release (0.5.6): upgrading LMCache
  keeps the cache on disk.

``lmcache-cli`` (LMCache's CLI alone, no native extensions) is checked to be what it is: it
cannot run ``lmcache server`` or ``lmcache bench l2``, so it is no release to run the plugin in.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support import Gateway, LMCacheServer, wait_until
from tests.support.compat import MAIN_VERSION, basic_check, bench_l2, client, run, venv_bin

pytestmark = [pytest.mark.slow, pytest.mark.integration]

# The releases under test: the supported range's ends and the newest pre-release on PyPI.
VERSIONS = ["0.5.4", "0.5.5", MAIN_VERSION, "0.5.7rc2"]
CHUNKS = "4"


@pytest.fixture
def servers(workdir: Path) -> Iterator[Callable[[Path, str], LMCacheServer]]:
    made: list[LMCacheServer] = []

    def make(bin_dir: Path, spec: str) -> LMCacheServer:
        server = LMCacheServer(workdir, spec, tag=f"-{len(made)}", bin_dir=bin_dir)
        made.append(server)
        return server.start()

    yield make
    for server in made:
        server.kill()


@pytest.mark.parametrize("version", VERSIONS)
def test_lmcache_harnesses_pass_against_the_plugin(
    version: str, gateway: Gateway, workdir: Path
) -> None:
    bin_dir = venv_bin(f"lmcache=={version}")
    spec = gateway.l2_adapter_json()

    rows = basic_check(bin_dir, spec)
    assert set(rows) >= {"LOOKUP (absent)", "STORE", "LOOKUP (exist)", "LOAD", "content"}, rows
    assert all(passed == total > 0 for passed, total in rows.values()), rows

    for size_kb, align, keys in (("256", "4096", "32"), ("257", "1", "16")):
        ops = bench_l2(
            bin_dir,
            spec,
            workdir / f"verify-{size_kb}.json",
            *("--l1-align-bytes", align, "--data-size-kb", size_kb, "--num-keys", keys),
            *("--no-skip-verify", "--lookup-max-hit-rate", "1"),
        )
        for name in ("Store", "Lookup", "Load"):
            assert ops[name]["total_success"] == ops[name]["total_keys"] > 0, (size_kb, ops[name])

    shape = ("--l1-align-bytes", "4096", "--data-size-kb", "4096", "--num-keys", "8")
    stored = bench_l2(bin_dir, spec, workdir / "store.json", "--only", "store", *shape)["Store"]
    assert stored["total_success"] == stored["total_keys"] > 0, stored
    assert roundtrip(bin_dir, "store", spec, seed=1).returncode == 0
    gateway.restart()
    loaded = bench_l2(bin_dir, spec, workdir / "load.json", "--only", "load", *shape)["Load"]
    assert loaded["total_success"] == stored["total_keys"], loaded
    verified = roundtrip(bin_dir, "verify", spec, seed=1)
    assert verified.returncode == 0, verified.stdout[-2000:] + verified.stderr[-2000:]
    assert roundtrip(bin_dir, "verify", spec, seed=2).returncode == 1  # never stored


def roundtrip(bin_dir: Path, action: str, spec: str, seed: int) -> subprocess.CompletedProcess[str]:
    """tests/support/l2_roundtrip.py in that release: 6 objects of 9 MiB + 17 bytes, each its
    own seeded bytes, through LMCache's own adapter stack (factory + native_plugin wrapper)."""
    module = "tests.support.l2_roundtrip"
    size = str(9 * 2**20 + 17)
    return run([str(bin_dir / "python"), "-m", module, action, spec, "6", size, str(seed)])


@pytest.mark.parametrize("version", VERSIONS)
def test_lmcache_server_stores_and_loads_through_the_plugin(
    version: str, gateway: Gateway, servers: Callable[[Path, str], LMCacheServer]
) -> None:
    bin_dir = venv_bin(f"lmcache=={version}")
    server = servers(bin_dir, gateway.l2_adapter_json())
    assert client(bin_dir, server, "store", 1, "--chunks", CHUNKS)[0] == 0
    wait_until(server.l2_settled, 60, "the L2 stores to finish")
    server.clear_l1()
    code, report = client(bin_dir, server, "check", 1, "--chunks", CHUNKS, "--expect-tier", "l2")
    assert code == 0, report
    assert client(bin_dir, server, "check", 2, "--chunks", CHUNKS)[0] == 1  # never stored

    server.stop()
    server = servers(bin_dir, gateway.l2_adapter_json())  # a new process, an empty L1
    code, report = client(bin_dir, server, "check", 1, "--chunks", CHUNKS, "--expect-tier", "l2")
    assert code == 0, report
    server.stop()

    if version != MAIN_VERSION:  # an upgrade (or downgrade) to the main release keeps the cache
        main_bin = venv_bin(f"lmcache=={MAIN_VERSION}")
        server = servers(main_bin, gateway.l2_adapter_json())
        code, report = client(
            main_bin, server, "check", 1, "--chunks", CHUNKS, "--expect-tier", "l2"
        )
        assert code == 0, report


def test_lmcache_cli_cannot_run_the_server_or_the_l2_bench(gateway: Gateway) -> None:
    """lmcache-cli 0.5.7rc3.dev0, the newest pre-release of that name: LMCache's CLI alone (the
    same `lmcache` package as lmcache 0.5.7rc2 without its native extensions, no torch
    required). Its `lmcache server` refuses to start and `bench l2` cannot import LMCache's
    memory objects, so the plugin needs the full `lmcache` distribution."""
    bin_dir = venv_bin("lmcache-cli==0.5.7rc3.dev0")
    server = run([str(bin_dir / "lmcache"), "server"])
    assert server.returncode != 0
    assert "requires the full lmcache installation" in server.stdout + server.stderr
    bench = run(
        [
            *(str(bin_dir / "lmcache"), "bench", "l2"),
            *("--l2-adapter", gateway.l2_adapter_json(), "--num-keys", "4"),
        ]
    )
    assert bench.returncode != 0
    assert "device_ops" in bench.stderr  # ImportError: cannot import name 'device_ops'
