"""Side-by-side L2 throughput: the disk's own O_DIRECT limit, lmcache-adp, and LMCache's fs_native.

    python -m bench.compare_l2 --dir /path/on/the/disk [--sizes-kb 256,4096,32768] [--keys 8] \
        [--sync-policies always,periodic,none]

Every adapter runs through LMCache's own harness (`lmcache bench l2`, bench/harness.py), stores
in one process and loads in a new one (`--only store`, then `--only load`), so loads are cold:
lmcache-adp reads with O_DIRECT after a gateway restart; fs_native's files get
posix_fadvise(DONTNEED) in between. lmcache-adp runs once per sync policy (``sync: X`` in the
gateway's --config, with ``sync_interval_ms`` for ``periodic``); a policy the gateway rejects
is recorded with its error and skipped. The first policy is the headline "lmcache-adp" column
and the only one that also loads (loads do not depend on the policy; ``--load-every-policy``);
``none`` matches fs_native, which never syncs. The disk probe (bench/device.py) moves the same
bytes with the gateway's I/O size and depth. Gateway CPU seconds per GB moved are taken from
/proc for each policy.
Writes ``bench/results/compare_l2.json`` and prints a markdown table (MB/s = 10^6 bytes/s).
bench/storage.py runs this together with the EXISTS and restart benchmarks.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import gateways
from bench.device import device_limit, gateway_io_shape
from bench.harness import bytes_per_phase, lmcache_bench, run_fs_native
from tests.support import Gateway, short_tmpdir

POLICIES = "always,periodic,none"
MBPS_PER_MIBPS = 1.048576


def run_ours(
    directory: Path, size_kb: int, keys: int, settings: dict[str, Any], load: bool = True
) -> dict[str, Any]:
    """Store through the harness, then (``load``) restart the gateway and load. Raises if the
    gateway won't start; ``{"error": line}`` when it rejects ``settings``."""
    workdir = directory / "adp"
    workdir.mkdir()
    sockdir = short_tmpdir()  # Unix socket paths are limited to 108 bytes
    config = gateways.write_config(workdir / "gateway.yaml", settings)
    gateway = Gateway(workdir, "12GiB", "--config", str(config), socket_path=sockdir / "gw.sock")
    try:
        error = gateways.start(gateway)
        if error is not None:
            return {"error": error}
        spec = gateway.l2_adapter_json(op_timeout_s=60.0)
        store = lmcache_bench(spec, "store", size_kb, keys, workdir / "s.json")
        cpu_store = gateways.cpu_seconds(gateway)  # a fresh gateway: all of it was the stores
        moved_gb = store["keys"] * size_kb * 1024 / 1e9
        result = {"store_MiBps": store["MiBps"], "gateway_cpu_s_per_GB_store": cpu_store / moved_gb}
        if not load:
            return {**result, "sessions_dropped": gateways.dropped_sessions(gateway)}
        gateway.stop()
        error = gateways.start(gateway)
        if error is not None:
            raise RuntimeError(f"the gateway did not restart: {error}")
        loaded = lmcache_bench(spec, "load", size_kb, keys, workdir / "l.json")
        result["load_MiBps"] = loaded["MiBps"]
        result["gateway_cpu_s_per_GB_load"] = gateways.cpu_seconds(gateway) / moved_gb
        return {**result, "sessions_dropped": gateways.dropped_sessions(gateway)}
    finally:
        gateway.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(sockdir, ignore_errors=True)


def run(
    directory: Path,
    sizes_kb: list[int],
    keys: int,
    policies: list[str],
    interval_ms: int = 50,
    probe_min_bytes: int = 256 * 2**20,
    load_every_policy: bool = False,
) -> list[dict[str, Any]]:
    """One row per object size: the disk, ours per sync policy, fs_native O_DIRECT/buffered.

    Loads do not depend on the sync policy, so only the first (headline) policy loads unless
    ``load_every_policy``."""
    directory.mkdir(parents=True, exist_ok=True)
    rejected: dict[str, dict[str, Any]] = {}  # a policy rejected once is not tried again
    results: list[dict[str, Any]] = []
    for size_kb in sizes_kb:
        total = bytes_per_phase(size_kb, keys)
        row: dict[str, Any] = {"size_kb": size_kb, "bytes_per_phase": total}
        row["device"] = device_limit(
            directory, max(total, probe_min_bytes), *gateway_io_shape(size_kb * 1024)
        )
        row["lmcache_adp"] = {}
        for policy in policies:
            settings = gateways.sync_settings(policy, interval_ms)
            load = load_every_policy or policy == policies[0]
            outcome = rejected.get(policy) or _attempt(
                run_ours, directory, size_kb, keys, settings, load
            )
            if "error" in outcome:
                rejected[policy] = outcome
            row["lmcache_adp"][policy] = {"settings": settings, **outcome}
        row["fs_native_odirect"] = _attempt(run_fs_native, directory, size_kb, keys, True)
        row["fs_native_buffered"] = _attempt(run_fs_native, directory, size_kb, keys, False)
        results.append(row)
        print(json.dumps(row), flush=True)
    return results


def _attempt(contender: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """The contender's result, or ``{"failed": why}``: one broken contender spoils no other."""
    try:
        return contender(*args)
    except Exception as exc:
        traceback.print_exc()
        return {"failed": f"{type(exc).__name__}: {exc}"[-2000:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--sizes-kb", default="256,4096,32768")
    parser.add_argument("--keys", type=int, default=8, help="keys per submit (2 in flight)")
    parser.add_argument("--sync-policies", default=POLICIES, help="the first is the headline")
    parser.add_argument("--sync-interval-ms", type=int, default=50, help="for periodic")
    parser.add_argument(
        "--load-every-policy", action="store_true", help="not only the first policy loads"
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results/compare_l2.json"))
    args = parser.parse_args()
    policies = args.sync_policies.split(",")
    results = run(
        args.dir,
        [int(s) for s in args.sizes_kb.split(",")],
        args.keys,
        policies,
        args.sync_interval_ms,
        load_every_policy=args.load_every_policy,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python -m bench.compare_l2", *sys.argv[1:]])
    args.out.write_text(json.dumps({"command": command, "results": results}, indent=1))
    print(table(results, policies))
    print(sync_table(results, policies))
    return 0


def size_label(size_kb: int) -> str:
    return f"{size_kb // 1024} MiB" if size_kb >= 1024 and size_kb % 1024 == 0 else f"{size_kb} KiB"


def _mbps(result: dict[str, Any], op: str) -> float | None:
    value = result.get(f"{op}_MiBps")
    return None if value is None else float(value) * MBPS_PER_MIBPS


def _cell(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ratio(top: float | None, bottom: float | None) -> str:
    return "-" if top is None or not bottom else f"{top / bottom:.2f}"


def table(results: list[dict[str, Any]], policies: list[str]) -> str:
    """Markdown: MB/s of the disk, ours (first policy), fs_native; ours over disk and fs_native."""
    headline = policies[0]
    lines = [
        f"| object | op | disk O_DIRECT | lmcache-adp (sync {headline}) | fs_native O_DIRECT "
        "| fs_native buffered | adp / disk | adp / fs_native O_DIRECT |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in results:
        for op, device_key in (("store", "write_GBps"), ("load", "read_GBps")):
            disk = row["device"][device_key] * 1e3
            ours = _mbps(row["lmcache_adp"][headline], op)
            odirect = _mbps(row["fs_native_odirect"], op)
            buffered = _mbps(row["fs_native_buffered"], op)
            cells = " | ".join(_cell(v) for v in (disk, ours, odirect, buffered))
            ratios = f"{_ratio(ours, disk)} | {_ratio(ours, odirect)}"
            lines.append(f"| {size_label(row['size_kb'])} | {op} | {cells} | {ratios} |")
    return "\n".join(lines)


def sync_table(results: list[dict[str, Any]], policies: list[str]) -> str:
    """Markdown: per sync policy, store and load MB/s and gateway CPU s/GB (store / load)."""
    lines = [
        "| object | sync | store MB/s | load MB/s | store / disk | gateway CPU s/GB store / load |",
        "|---|---|---|---|---|---|",
    ]
    for row in results:
        disk = row["device"]["write_GBps"] * 1e3
        for policy in policies:
            result = row["lmcache_adp"][policy]
            label = f"| {size_label(row['size_kb'])} | {policy} |"
            if "error" in result or "failed" in result:
                why = f"rejected: {result['error']}" if "error" in result else "failed"
                lines.append(f"{label} {_escape(why)} | | | |")
                continue
            store, load = _mbps(result, "store"), _mbps(result, "load")
            cpu_load = result.get("gateway_cpu_s_per_GB_load")
            cpu = f"{result['gateway_cpu_s_per_GB_store']:.2f} / {_cell(cpu_load, 2)}"
            lines.append(
                f"{label} {_cell(store)} | {_cell(load)} | {_ratio(store, disk)} | {cpu} |"
            )
    return "\n".join(lines)


def _escape(text: str) -> str:
    return text.replace("|", "\\|")[-160:]


if __name__ == "__main__":
    sys.exit(main())
