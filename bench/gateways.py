"""Our gateway as a benchmark contender: its config file, start-up (or the error it gave), CPU.

A setting the gateway does not know (say a sync policy that is not implemented yet) makes it
exit at start-up with one error line; ``start`` returns that line instead of raising, so the
benchmark records it and moves on.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from adp_gateway.card.software.format import HEADER_BYTES
from adp_gateway.config import GatewayConfig
from adp_wire.ring.layout import align_up
from tests.support import Gateway, wait_until

START_TIMEOUT_S = 120


def sync_settings(policy: str, interval_ms: int) -> dict[str, Any]:
    """The config for a sync policy: ``sync: X``, and for ``periodic`` its interval."""
    settings: dict[str, Any] = {"sync": policy}
    if policy == "periodic":
        settings["sync_interval_ms"] = interval_ms
    return settings


def contender_settings(contender: str) -> tuple[str, dict[str, Any]]:
    """A contender's name and the settings after its ``@``: ``adp-periodic@io_threads=16;
    sync_interval_ms=5`` is ``("adp-periodic", {"io_threads": 16, "sync_interval_ms": 5})``
    (each value read as YAML)."""
    name, _, rest = contender.partition("@")
    return name, settings_of(rest)


def settings_of(text: str) -> dict[str, Any]:
    """``io_threads=16;sync_interval_ms=5`` as ``{"io_threads": 16, "sync_interval_ms": 5}``
    (each value read as YAML)."""
    pairs = (setting.partition("=") for setting in text.split(";") if setting)
    return {key: yaml.safe_load(value) for key, _, value in pairs}


def write_config(path: Path, settings: dict[str, Any]) -> Path:
    """A gateway config of ``settings``, admission off unless they say otherwise: these benches
    time the path and load back every key they store, where the default write budget (a drive
    write a day of a small bench card) would decline half of a burst. bench/trace_replay.py,
    which judges admission, writes its own."""
    path.write_text(yaml.safe_dump({"admission": False, **settings}))
    return path


def capacity_for(objects: int, object_bytes: int, databases: int = 1) -> str:
    """``--capacity`` for ``objects`` of ``object_bytes`` with no eviction (capacity_bytes_for)."""
    return f"{-(-capacity_bytes_for(objects, object_bytes, databases) // 2**20)}MiB"


def capacity_bytes_for(objects: int, object_bytes: int, databases: int = 1) -> int:
    """Room for ``objects`` of ``object_bytes`` (header + padded payload) with no eviction, on
    ``databases`` databases. The gateway gives each database an equal share of the capacity
    while fragments land on databases by their key's hash (adp_wire/fragmenter.py), so with
    several each gets room for the fullest one: the mean plus four standard deviations."""
    defaults = GatewayConfig()
    if databases == 1:
        record = 2 * HEADER_BYTES + align_up(object_bytes)  # a header; a page for index entries
        return objects * record * 5 // 4 + 4 * defaults.region_size  # partly filled regions
    per_object = max(1, -(-object_bytes // defaults.fragment_size))
    fragments = objects * per_object
    mean = fragments / databases
    fullest = min(fragments, math.ceil(mean + 4 * math.sqrt(mean)) + per_object)
    record = 2 * HEADER_BYTES + align_up(min(object_bytes, defaults.fragment_size))
    return (fullest * record * 5 // 4 + 4 * defaults.region_size) * databases


def databases_of(settings: dict[str, Any]) -> int:
    """How many databases a gateway with these settings and one data dir opens (1 when
    ``databases_per_dir`` is not a positive number: the gateway itself then refuses it)."""
    value = settings.get("databases_per_dir", 1)
    return value if isinstance(value, int) and value >= 1 else 1


def start(gateway: Gateway, module: bool = False) -> str | None:
    """Start ``gateway``; None once it listens, else the error it exited with.

    ``module``: run it as ``python -m adp_gateway serve`` rather than the ``adp-gateway`` script.
    """
    mark = len(gateway.log())
    if module:
        gateway.spawn([sys.executable, "-m", "adp_gateway", "serve", *gateway.args])
    else:
        gateway.start(wait=False)
    wait_until(
        lambda: "listening on" in gateway.log()[mark:] or not gateway.alive,
        START_TIMEOUT_S,
        "the gateway to listen",
    )
    if gateway.alive:
        return None
    lines = gateway.log()[mark:].strip().splitlines()
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or ["exited without a message"])[-1]


def dropped_sessions(gateway: Gateway) -> dict[str, Any]:
    """Sessions the gateway dropped for a protocol error, from its log: how many, the first."""
    lines = [line for line in gateway.log().splitlines() if "dropping the session" in line]
    return {"count": len(lines), "first": lines[0] if lines else None}


def cpu_seconds(gateway: Gateway) -> float:
    """User + system CPU seconds the gateway process has used so far."""
    assert gateway.proc is not None
    with open(f"/proc/{gateway.proc.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
