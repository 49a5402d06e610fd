"""Restart time: from launching the gateway to the first EXISTS of known keys answering True.

    python -m bench.restart --dir /path/on/the/disk [--objects 100000] [--object-kb 4] \
        [--signals TERM,KILL] [--out bench/results/restart.json]

For each stop signal, in a fresh data dir on ``--dir``: a gateway is given ``--objects`` small
objects through the plugin (batches of 1,000 keys, 4 batches in flight; ``sync: none`` unless
``--populate-sync always``, which only slows the filling: a killed process loses no write the
disk already took), then stopped with SIGTERM (a clean stop) or SIGKILL (a crash). The clock
starts when ``python -m adp_gateway serve`` is launched again on the same data; a plugin that was
connected all along (reconnecting every 20 ms) asks EXISTS of 16 known keys, spread over the
whole population, every 5 ms until every one answers True. Also recorded: the gateway's own log
line "recovered N objects ... in X s", when it logged "listening on" (from its log's
timestamps), and how many of all the objects it answers True for afterwards (None when that
EXISTS failed).
"""

from __future__ import annotations

import argparse
import logging
import re
import shutil
import signal
import sys
import time
import traceback
from datetime import datetime
from pathlib import Path
from typing import Any

from bench import gateways, plugin
from bench.results import write as write_result
from tests.support import Gateway, short_tmpdir, wait_for_future

SIGNALS = {"TERM": signal.SIGTERM, "KILL": signal.SIGKILL}
PROBE_KEYS = 16
POLL_INTERVAL_S = 0.005
RECONNECT_INTERVAL_S = 0.02
READY_TIMEOUT_S = 900
RECOVERED = re.compile(r"recovered (\d+) objects\b.*?\bin ([0-9.]+) ?s\b")
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def measure(
    directory: Path,
    objects: int,
    object_bytes: int,
    stop_signal: str,
    populate_sync: str = "none",
) -> dict[str, Any]:
    workdir = directory / f"restart-{stop_signal.lower()}"
    workdir.mkdir(parents=True)
    sockdir = short_tmpdir()
    config = gateways.write_config(workdir / "gateway.yaml", {"sync": populate_sync})
    gateway = Gateway(
        workdir,
        gateways.capacity_for(objects, object_bytes),
        "--config",
        str(config),
        socket_path=sockdir / "gw.sock",
    )
    connector = None
    try:
        error = gateways.start(gateway)
        if error is not None:
            raise RuntimeError(f"the gateway did not start: {error}")
        connector = plugin.connect(
            gateway, op_timeout_s=120, reconnect_interval_s=RECONNECT_INTERVAL_S
        )
        plugin.wait_connected(connector)
        keys = plugin.object_keys(objects)
        result: dict[str, Any] = {
            "signal": f"SIG{stop_signal}",
            "objects": objects,
            "object_bytes": object_bytes,
            "populate": plugin.store_all(connector, keys, object_bytes),
        }
        stopping = time.perf_counter()
        result["exit_status"] = gateway.stop(SIGNALS[stop_signal], timeout_s=300)
        result["stop_seconds"] = time.perf_counter() - stopping

        step = max(1, objects // PROBE_KEYS)
        probe = sorted({*keys[::step][:PROBE_KEYS], keys[-1]})
        mark = len(gateway.log())
        launched_wall = time.time()
        launched = time.perf_counter()
        gateway.spawn([sys.executable, "-m", "adp_gateway", "serve", *gateway.args])
        polls = 0
        while True:
            polls += 1
            answers = plugin.exists(connector, probe)
            if answers and all(answers):
                break
            if not gateway.alive:
                raise RuntimeError(f"the gateway exited:\n{gateway.log()[mark:][-3000:]}")
            if time.perf_counter() - launched > READY_TIMEOUT_S:
                raise TimeoutError(f"no EXISTS answered True in {READY_TIMEOUT_S} s")
            time.sleep(POLL_INTERVAL_S)
        result["launch_to_first_hit_s"] = time.perf_counter() - launched
        result["polls"] = polls
        result["resolution_s"] = RECONNECT_INTERVAL_S + POLL_INTERVAL_S
        log = gateway.log()[mark:]
        result.update(_recovery_line(log))
        result["launch_to_listening_s"] = _logged_after(log, "listening on", launched_wall)
        item = wait_for_future(connector, connector.submit_batch_exists(keys), 300)
        result["found_after_restart"] = sum(item[3] or []) if item[1] else None
        result["sessions_dropped"] = gateways.dropped_sessions(gateway)
        return result
    finally:
        if connector is not None:
            connector.close()
        gateway.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(sockdir, ignore_errors=True)


def _recovery_line(log: str) -> dict[str, Any]:
    """The gateway's "recovered N objects ... in X s" line, and its N and X."""
    for line in log.splitlines():
        match = RECOVERED.search(line)
        if match:
            return {
                "recovery_log_line": line,
                "recovered_objects": int(match.group(1)),
                "recovery_logged_s": float(match.group(2)),
            }
    return {"recovery_log_line": None, "recovered_objects": None, "recovery_logged_s": None}


def _logged_after(log: str, text: str, since_wall: float) -> float | None:
    """Seconds from ``since_wall`` to the log line holding ``text`` (its timestamp, 1 ms)."""
    for line in log.splitlines():
        match = LOG_TIME.match(line)
        if match and text in line:
            logged = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            return round(logged - since_wall, 3)
    return None


def run(
    directory: Path,
    objects: int,
    object_bytes: int,
    signals: list[str],
    populate_sync: str = "none",
) -> dict[str, Any]:
    directory.mkdir(parents=True, exist_ok=True)
    # The plugin warns each time the gateway goes away; here that is the point.
    logging.getLogger("lmcache_adp").setLevel(logging.ERROR)
    result: dict[str, Any] = {}
    for name in signals:
        try:
            result[name] = measure(directory, objects, object_bytes, name, populate_sync)
        except Exception as exc:  # one variant failing leaves the other to run
            traceback.print_exc()
            result[name] = {"failed": f"{type(exc).__name__}: {exc}"[-2000:]}
    return result


def table(result: dict[str, Any]) -> str:
    lines = [
        "| stopped by | objects | launch -> first EXISTS hit | launch -> listening "
        "| recovery (gateway log) | recovered | found after | stop took |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in ((name, result[name]) for name in SIGNALS if name in result):
        if "launch_to_first_hit_s" not in r:
            lines.append(f"| SIG{name} | failed: {str(r.get('failed', '?'))[-120:]} ||||||||")
            continue
        size = f"{r['objects']:,} x {r['object_bytes'] // 1024} KiB"
        lines.append(
            f"| {r['signal']} | {size} | {r['launch_to_first_hit_s']:.2f} s "
            f"| {_seconds(r['launch_to_listening_s'])} | {_seconds(r['recovery_logged_s'])} "
            f"| {_count(r['recovered_objects'])} | {_count(r['found_after_restart'])} "
            f"| {r['stop_seconds']:.2f} s |"
        )
    return "\n".join(lines)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--objects", type=int, default=100_000)
    parser.add_argument("--object-kb", type=int, default=4)
    parser.add_argument("--signals", default="TERM,KILL", help="stop signals, of TERM and KILL")
    parser.add_argument("--populate-sync", default="none", choices=("none", "always"))
    parser.add_argument("--out", type=Path, default=Path("bench/results/restart.json"))
    args = parser.parse_args()
    signals = args.signals.split(",")
    unknown = set(signals) - set(SIGNALS)
    if unknown:
        parser.error(f"unknown signals {sorted(unknown)}; use TERM and/or KILL")
    result = run(args.dir, args.objects, args.object_kb * 1024, signals, args.populate_sync)
    command = " ".join(["python -m bench.restart", *sys.argv[1:]])
    write_result(args.out.with_suffix(""), "restart", {"command": command, **result})
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
