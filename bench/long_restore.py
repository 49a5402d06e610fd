"""A long prompt's KV restored cold from L2 into an empty L1 through a real ``lmcache server``.

    python -m bench.long_restore --dir DIR [--gb 8.6] [--shm-name NAME] [--mode cpu|gpu]
        [--databases 1,2,4] [--ram-l2 /dev/shm] [--adp-config FILE]

The target is a 196,000-token GLM prompt at ~43,723 bytes of KV per token: 8.6 GB in 256-token
chunks. The KV here is 43 layers x 2 KV heads x 128 x bfloat16 (44,032 bytes per token, 11.27 MB
per chunk against the target's 11.19 MB); ``--gb`` scales the prompt's length, not the chunks.

In one run, on ``--dir`` (the disk under test; a tmpfs such as /dev/shm/lr puts the gateway at
memory speed):
  0. every directory a contender stores in (``--dir``, ``--ram-l2``) is checked for O_DIRECT
     (bench/odirect.py) and its filesystem recorded; where it is refused the gateway and
     fs_native run buffered, and the floor (O_DIRECT only) is skipped;
  1. the disk's floor: O_DIRECT writes then reads of the same bytes at the gateway's I/O size and
     depth (bench/floor.py);
  2. lmcache-adp: gateway + ``lmcache server`` with our plugin; the prompt is stored through the
     server (bench/long_restore_client.py, LMCache's own client), written through to the
     gateway; then the server and the gateway are restarted (empty L1, gateway reads by
     O_DIRECT) and the restore is timed: LOOKUP with L2 prefetch + RETRIEVE into the KV cache;
     then the server's L1 is cleared and the restore is timed again (L1 pages written before).
     ``--databases 1,2,4`` runs it once per count of databases in ``--dir``
     (``databases_per_dir``, the capacity split between them), as a host with that many drives;
  3. LMCache's ``fs_native`` (``use_odirect``) the same way, its files fadvise'd out of the page
     cache before the restore;
  4. with ``--shm-name``, lmcache-adp again with L1 in a shared-memory segment (the plugin's
     zero-copy case);
  5. with ``--adp-config FILE``, lmcache-adp again with that gateway config (settings to weigh);
  6. with ``--ram-l2 DIR`` (a tmpfs such as /dev/shm), ``fs_native`` again with its files there,
     buffered: an L2 that reads at memory speed, so its restore time is what LMCache's own
     pipeline (lookup, prefetch into L1, retrieve into the KV cache) costs whatever the tier.
Beside every time, the CPU seconds of each process (the ``lmcache server``, the gateway, the
client) and per GB of the prompt: for the store from the STORE call until the write-through to
L2 has settled (the client's until its STORE returns), for the restore over LOOKUP + RETRIEVE;
read from /proc/PID/stat (every thread of the process) by the client at each end of its timed
section (bench/long_restore_client.py) and, for the store's end, by this bench.
Writes ``OUT.json`` and ``OUT.md`` (``--out``, default bench/results/long_restore).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from adp_gateway.host import hugepages
from bench import floor as disk_floor
from bench import gateways, odirect
from bench.harness import cpu_seconds_of, drop_file_cache
from bench.long_restore_report import markdown
from bench.results import write as write_result
from tests.support import BIN, ROOT, Gateway, LMCacheServer, remove_tree, short_tmpdir, wait_until

CHUNK_TOKENS = 256
TARGET = {"tokens": 196_000, "bytes_per_token": 43_723, "model": "GLM, 196,000-token prompt"}
L2_SETTLE_TIMEOUT_S = 1200


@dataclass(frozen=True)
class Prompt:
    """The long prompt's geometry: ``tokens`` of KV, 43 x 2 x 128 bfloat16 per token."""

    tokens: int
    layers: int = 43
    kv_heads: int = 2
    head_dim: int = 128

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2

    @property
    def total_bytes(self) -> int:
        return self.tokens * self.bytes_per_token

    @property
    def chunk_bytes(self) -> int:
        return CHUNK_TOKENS * self.bytes_per_token

    @classmethod
    def of_size(cls, gigabytes: float) -> Prompt:
        tokens = round(gigabytes * 1e9 / cls(0).bytes_per_token / CHUNK_TOKENS) * CHUNK_TOKENS
        return cls(tokens)

    def client_args(self) -> list[str]:
        shape = f"{self.layers},{self.kv_heads},{self.head_dim}"
        return [f"--tokens={self.tokens}", f"--kv-shape={shape}"]


@dataclass(frozen=True)
class Setup:
    """Where and how every contender runs."""

    directory: Path
    prompt: Prompt
    mode: str
    lmcache_bin: Path
    logs: Path | None = None  # where each contender's logs are kept, if anywhere

    @property
    def l1_size_gb(self) -> int:
        return math.ceil(self.prompt.total_bytes / 2**30 * 1.15) + 1


def run_client(
    setup: Setup, server: LMCacheServer, phase: str, pids: dict[str, int]
) -> dict[str, Any]:
    """One phase of bench/long_restore_client.py in a new process; its JSON result, with the
    CPU seconds of the processes in ``pids`` (name: pid) and of the client over its phase."""
    out = server.log_path.with_name(f"client-{phase}{time.monotonic_ns()}.json")
    argv = [sys.executable, "-m", "bench.long_restore_client", f"--phase={phase}"]
    argv += [f"--rpc-url=tcp://localhost:{server.port}", f"--mode={setup.mode}"]
    argv += [*setup.prompt.client_args(), f"--json-out={out}"]
    argv += ["--cpu-pids=" + ",".join(f"{name}={pid}" for name, pid in pids.items())]
    with open(server.log_path.with_name(f"client-{phase}.log"), "ab") as log:
        subprocess.run(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=1800)
    if not out.exists():
        raise RuntimeError(f"the {phase} client wrote no result; see {log.name}")
    return dict(json.loads(out.read_text()))


def start_server(setup: Setup, workdir: Path, spec: str, tag: str, shm: str | None) -> Any:
    server = LMCacheServer(workdir, spec, tag, setup.lmcache_bin, setup.l1_size_gb, shm)
    return server.start()


def store_then_restore(
    setup: Setup,
    workdir: Path,
    spec: str,
    between: Callable[[], None],
    shm_name: str | None = None,
    gateway: Gateway | None = None,
) -> dict[str, Any]:
    """Store through one server, wait for L2, stop it, ``between()``, restore through a new one.
    The CPU of the server, of ``gateway`` (when there is one) and of the client is read over
    each phase."""
    server = start_server(setup, workdir, spec, "-store", shm_name)
    try:
        pids = phase_pids(server, gateway)
        stored = run_client(setup, server, "store", pids)
        started = time.perf_counter()
        wait_until(server.l2_settled, L2_SETTLE_TIMEOUT_S, "the L2 write-through")
        stored["l2_settle_after_store_s"] = time.perf_counter() - started
        settled = dict(zip(pids, cpu_seconds_of(tuple(pids.values())), strict=True))
        start = stored.pop("cpu_start")
        stored["cpu_s"].update({name: settled[name] - start[name] for name in pids})
    finally:
        server.stop()
    between()
    server = start_server(setup, workdir, spec, "-restore", shm_name)
    try:
        restored = run_client(setup, server, "restore", phase_pids(server, gateway))
    finally:
        server.stop()
    restored["digest_matches_store"] = restored["digest"] == stored["digest"]
    return {"store": stored, "restore": restored}


def phase_pids(server: LMCacheServer, gateway: Gateway | None) -> dict[str, int]:
    """The processes whose CPU a phase reads: the server, and the gateway where there is one."""
    assert server.proc is not None
    pids = {"server": server.proc.pid}
    if gateway is not None:
        assert gateway.proc is not None
        pids["gateway"] = gateway.proc.pid
    return pids


def run_adp(
    setup: Setup,
    shm_name: str | None = None,
    zero_copy: bool = True,
    config: Path | None = None,
    databases: int = 1,
) -> dict[str, Any]:
    """lmcache-adp: both the server and the gateway are restarted between store and restore.
    With ``shm_name`` L1 is shared memory, which the plugin uses zero-copy unless told not to;
    ``config`` is a gateway config file (``adp-gateway serve --config``); ``databases`` is its
    ``databases_per_dir`` in ``--dir``."""
    workdir = setup.directory / "adp"
    workdir.mkdir()
    sockdir = short_tmpdir()  # Unix socket paths are limited to 108 bytes
    chunks = setup.prompt.tokens // CHUNK_TOKENS
    capacity = gateways.capacity_for(chunks, setup.prompt.chunk_bytes, databases)
    if databases > 1:
        config = with_databases(config, databases, workdir / "gateway-databases.yaml")
    extra = ("--config", str(config)) if config else ()
    gateway = Gateway(workdir, capacity, *extra, socket_path=sockdir / "gw.sock")

    def restart_gateway() -> None:
        gateway.stop()
        start_gateway(gateway)

    try:
        start_gateway(gateway)
        spec = gateway.l2_adapter_json(op_timeout_s=60.0, zero_copy=zero_copy)
        result = store_then_restore(setup, workdir, spec, restart_gateway, shm_name, gateway)
        result["databases"] = databases
        result["gateway_cpu_s_restore"] = gateways.cpu_seconds(gateway)
        result["sessions_dropped"] = gateways.dropped_sessions(gateway)
        result["zero_copy_ops"] = zero_copy_ops(gateway.log())
        return result
    finally:
        gateway.stop()
        name = "lmcache_adp" + ("_shm" if shm_name else "") + ("" if zero_copy else "_copy")
        name += f"_{config.stem}" if config else ""
        name += f"_{databases}db" if databases > 1 else ""
        keep_logs(setup, workdir, name)
        for path in (workdir, sockdir):
            remove_tree(path)


def with_databases(config: Path | None, databases: int, path: Path) -> Path:
    """A gateway config file: ``config``'s settings (if any) with ``databases_per_dir``."""
    settings = yaml.safe_load(config.read_text()) if config else {}
    return gateways.write_config(path, {**(settings or {}), "databases_per_dir": databases})


def adp_key(databases: int) -> str:
    """The report's key of lmcache-adp with ``databases`` databases."""
    return "lmcache_adp" if databases == 1 else f"lmcache_adp_{databases}db"


def zero_copy_ops(gateway_log: str) -> int:
    """Stores the gateway wrote straight from L1, from its session summary lines."""
    return sum(int(n) for n in re.findall(r"(\d+) of the stores zero-copy", gateway_log))


def start_gateway(gateway: Gateway) -> None:
    error = gateways.start(gateway, module=True)  # the module: no console script on the device
    if error is not None:
        raise RuntimeError(f"the gateway did not start: {error}")


def run_fs_native(setup: Setup) -> dict[str, Any]:
    """LMCache's fs_native with O_DIRECT; its files leave the page cache before the restore."""
    workdir = setup.directory / "fs"
    base = workdir / "l2"
    return _fs_native(setup, "fs_native", workdir, base, lambda: drop_file_cache(base))


def run_ram_l2(setup: Setup, ram_dir: Path) -> dict[str, Any]:
    """fs_native with its files on a tmpfs, buffered: the restore at memory speed."""
    base = ram_dir / f"adp-bench-ram-l2-{os.getpid()}"
    return _fs_native(setup, "ram_l2", setup.directory / "ram", base, None)


def _fs_native(
    setup: Setup, name: str, workdir: Path, base: Path, drop_cache: Callable[[], None] | None
) -> dict[str, Any]:
    """fs_native with its files in ``base``: O_DIRECT where ``drop_cache`` empties the page cache
    of them before the restore, buffered (nothing dropped) where it is None."""
    workdir.mkdir(exist_ok=True)
    base.mkdir(parents=True)
    spec = {"type": "fs_native", "base_path": str(base), "use_odirect": drop_cache is not None}
    try:
        return store_then_restore(setup, workdir, json.dumps(spec), drop_cache or (lambda: None))
    finally:
        keep_logs(setup, workdir, name)
        remove_tree(workdir)
        remove_tree(base)


def keep_logs(setup: Setup, workdir: Path, contender: str) -> None:
    if setup.logs is not None:
        shutil.copytree(workdir, setup.logs / contender, ignore=_not_logs, dirs_exist_ok=True)


def _not_logs(directory: str, names: list[str]) -> list[str]:
    return [n for n in names if not n.endswith((".log", ".json"))]


DEEP_PROBE = disk_floor.Shape("deep", 16 * 2**20, 32)  # deeper than any contender's reads


def floor(setup: Setup) -> dict[str, Any]:
    """The disk's own O_DIRECT write and read of the prompt's bytes: at the gateway's I/O shape
    and at a deeper one, the faster read being the floor (a restore keeps many chunks in
    flight, so the gateway's shape alone can read slower than the restore itself). Skipped
    (``{"skipped": why}``) where ``--dir`` refuses O_DIRECT."""
    check = odirect.check(setup.directory)
    if check["odirect"] != odirect.WORKS:
        return {"skipped": odirect.line(check)}
    gateway = disk_floor.gateway_shapes(setup.prompt.chunk_bytes)
    total = setup.prompt.total_bytes // 2**20 * 2**20
    probes = [
        disk_floor.limit(setup.directory / "floor", total, gateway["write"], gateway["read"]),
        disk_floor.limit(setup.directory / "floor", total, DEEP_PROBE, DEEP_PROBE),
    ]
    best = max(probes, key=lambda probe: probe["read_GBps"])
    return {
        **best,
        "read_s": best["total_bytes"] / best["read_GBps"] / 1e9,
        "probes": probes,
    }


def attempt(contender: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """The contender's result, or ``{"failed": why}``: one broken contender spoils no other."""
    try:
        return contender(*args)
    except Exception as exc:
        return {"failed": f"{type(exc).__name__}: {exc}"[-2000:]}


def check_dirs(directories: list[Path]) -> list[dict[str, Any]]:
    """Each directory's O_DIRECT check (bench/odirect.py), created first if need be; printed."""
    checks = []
    for directory in directories:
        directory.mkdir(parents=True, exist_ok=True)
        checks.append(odirect.check(directory))
        print(odirect.line(checks[-1]), flush=True)
    return checks


def run(
    setup: Setup,
    shm_name: str | None,
    config: Path | None = None,
    ram_dir: Path | None = None,
    databases: tuple[int, ...] = (1,),
) -> dict[str, Any]:
    setup.directory.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"floor": floor(setup)}
    print(json.dumps(results["floor"]), flush=True)
    for count in databases:
        key = adp_key(count)
        results[key] = attempt(run_adp, setup, None, True, None, count)
        print(json.dumps(results[key]), flush=True)
    if config is not None:  # the gateway with other settings, between the default and fs_native
        results["lmcache_adp_config"] = attempt(run_adp, setup, None, True, config)
        results["lmcache_adp_config"]["config"] = config.read_text()
        print(json.dumps(results["lmcache_adp_config"]), flush=True)
    results["fs_native"] = attempt(run_fs_native, setup)
    print(json.dumps(results["fs_native"]), flush=True)
    if shm_name is not None:  # the same shared-memory L1, copied through the window, then not
        results["lmcache_adp_shm_copy"] = attempt(run_adp, setup, shm_name, False)
        print(json.dumps(results["lmcache_adp_shm_copy"]), flush=True)
        results["lmcache_adp_shm"] = attempt(run_adp, setup, shm_name)
        print(json.dumps(results["lmcache_adp_shm"]), flush=True)
    if ram_dir is not None:
        results["ram_l2"] = attempt(run_ram_l2, setup, ram_dir)
        print(json.dumps(results["ram_l2"]), flush=True)
    return results


def environment(setup: Setup) -> dict[str, Any]:
    git = ["git", "rev-parse", "--short", "HEAD"]
    # A snapshot (`git archive`) names its commit in ADP_COMMIT: git would name the enclosing one.
    commit = (
        os.environ.get("ADP_COMMIT")
        or subprocess.run(git, cwd=ROOT, capture_output=True, text=True).stdout.strip()
    )
    return {
        "commit": commit or None,
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "mode": setup.mode,
        "l1_size_gb": setup.l1_size_gb,
        "shmem_huge_pages": hugepages.shmem_setting(),  # docs/operations.md, "Huge pages"
        "prompt": {**asdict(setup.prompt), "bytes": setup.prompt.total_bytes},
        "target": {**TARGET, "bytes": TARGET["tokens"] * TARGET["bytes_per_token"]},  # type: ignore[operator]
    }


def database_counts(text: str) -> tuple[int, ...]:
    """``1,2,4`` as (1, 2, 4): positive, each once."""
    try:
        counts = tuple(int(item) for item in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: counts of databases, such as 1,2,4") from None
    if not counts or min(counts) < 1 or len(set(counts)) != len(counts):
        raise argparse.ArgumentTypeError(f"{text!r}: positive counts, each once, such as 1,2,4")
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True, help="on the disk under test")
    parser.add_argument("--gb", type=float, default=8.6, help="prompt KV size, 10^9 bytes")
    parser.add_argument("--mode", choices=["cpu", "gpu"], default="cpu", help="KV cache device")
    parser.add_argument("--shm-name", help="also run lmcache-adp with L1 in /dev/shm/NAME")
    parser.add_argument("--lmcache-bin", type=Path, default=BIN, help="holds `lmcache`")
    parser.add_argument("--out", type=Path, default=Path("bench/results/long_restore"))
    parser.add_argument("--logs", type=Path, help="keep the processes' logs here")
    parser.add_argument(
        "--adp-config", type=Path, help="also run lmcache-adp with this gateway config file"
    )
    parser.add_argument(
        "--ram-l2", type=Path, help="also run fs_native on this tmpfs: LMCache's own restore cost"
    )
    parser.add_argument(
        "--databases",
        type=database_counts,
        default=(1,),
        help="run lmcache-adp with each of these counts of databases in --dir (default 1)",
    )
    args = parser.parse_args()
    setup = Setup(args.dir, Prompt.of_size(args.gb), args.mode, args.lmcache_bin, args.logs)
    directories = [args.dir] if args.ram_l2 is None else [args.dir, args.ram_l2]
    report = {
        "command": " ".join(["python -m bench.long_restore", *sys.argv[1:]]),
        **environment(setup),
        "odirect": check_dirs(directories),
        "results": run(setup, args.shm_name, args.adp_config, args.ram_l2, args.databases),
    }
    write_result(args.out, "long_restore", report)
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
