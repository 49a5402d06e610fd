"""``adp-gateway status``: ask a running gateway how it is doing, over its own socket.

The gateway answers the gateway's own user and root (its answer names every tenant); the
answer is printed as a few lines for people, or as JSON with ``--json``.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

from adp_gateway.errors import HandshakeRefused, StartupError
from adp_wire.protocol import connect_within, recv_frame, send_frame, status_request
from adp_wire.units import format_size

TIMEOUT_S = 5.0
RENDERED_KEYS = frozenset(
    {
        "socket",
        "ready",
        "used_bytes",
        "capacity_bytes",
        "objects",
        "evicted_regions",
        "sessions",
        "queued",
        "store_backlog_bytes",
        "write_depth_bytes",
        "tenants",
        "io_threads",
        "at_io_thread_share",
        "databases",
        "rates_last_minute",
        "admission",
    }
)  # the status keys ``render`` reads


def ask(socket_path: str) -> dict[str, Any]:
    """The running gateway's status; StartupError when none answers at ``socket_path``."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(TIMEOUT_S)
    deadline = time.monotonic() + TIMEOUT_S  # for the whole exchange, however it is paced
    try:
        connect_within(sock, socket_path, deadline)
        send_frame(sock, status_request(), deadline=deadline)
        body, _ = recv_frame(sock, deadline=deadline)
    except OSError as exc:
        raise StartupError(
            f"no gateway answers at {socket_path} ({exc.strerror or exc}): is it running, and "
            "is that its `--socket`?"
        ) from exc
    finally:
        sock.close()
    if body.get("ok") is not True:
        raise HandshakeRefused(str(body.get("error", "the gateway refused")))
    status: dict[str, Any] = body["status"]
    return status


def describe(status: dict[str, Any]) -> str:
    """``render``'s lines, or, from a gateway older than this client (still running after an
    upgrade, its status without keys ``render`` reads), a line that names them and its status
    as JSON."""
    missing = sorted(RENDERED_KEYS - status.keys())
    if missing:
        return (
            f"this gateway's status has no {', '.join(missing)} (the gateway is older than this "
            "adp-gateway; restart it to upgrade); its status as JSON:\n"
            + json.dumps(status, indent=2)
        )
    return render(status)


def render(status: dict[str, Any]) -> str:
    used, capacity = status["used_bytes"], status["capacity_bytes"]
    queued = status["queued"]
    lines = [
        f"gateway on {status['socket']}: {'ready' if status['ready'] else 'not ready'}",
        f"  capacity {_size(capacity)}, used {_size(used)} "
        f"({100 * used / max(capacity, 1):.0f} %), {_count(status['objects'], 'object')}, "
        f"{_count(status['evicted_regions'], 'region')} evicted",
        f"  sessions: {_sessions(status['sessions'])}",
        f"  queued: {_count(queued['loads'], 'load')}, {_count(queued['stores'], 'store')} "
        f"({_size(status['store_backlog_bytes'])}), {_count(queued['deletes'], 'delete')}; "
        f"stores may write {_size(status['write_depth_bytes'])} at once",
    ]
    for name, tenant in status["tenants"].items():
        lines.append(
            f"  tenant {name!r}: {_count(tenant['sessions'], 'session')}, uses "
            f"{_size(tenant['pool_bytes'])} of disk (whole regions) of the "
            f"{_size(tenant['pool_limit_bytes'])} it may use"
        )
    threads = status["io_threads"]
    if threads["held"] or threads["alive"] > threads["size"]:
        lines.append(
            f"  I/O threads: {threads['alive']} alive for io_threads {threads['size']}, "
            f"{threads['held']} held by a task running a second or more"
        )
    at_share = status["at_io_thread_share"]
    if any(at_share.values()):
        lines.append(
            f"  holding every I/O thread they may: {_count(at_share['sessions'], 'session')} "
            f"by reads of client memory, {_count(at_share['databases'], 'database')}"
        )
    for db in status["databases"]:
        health = db["health"]
        if db["errors_last_minute"]:
            errors = _count(db["errors_last_minute"], "error")
            health += f" ({errors} in the last minute: {db['last_error']})"
        lines.append(f"  database {db['database']} {db['path']}: {health}")
    rates = status["rates_last_minute"]
    shown = ", ".join(_rate(name, rate) for name, rate in rates.items()) or "nothing yet"
    lines.append(f"  last minute: {shown}")
    lines += _admission(status["admission"])
    return "\n".join(lines)


def _count(number: int, noun: str) -> str:
    """``1 session``, ``2 sessions``."""
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _size(size_bytes: int) -> str:
    """``256 MiB`` rather than ``256.0 MiB``; ``7.9 GiB`` stays."""
    return format_size(size_bytes).replace(".0 ", " ")


def _admission(state: dict[str, Any]) -> list[str]:
    """Writes against the budget, and what admission admitted and declined."""
    rate = f"writes {_size(int(state['write_rate_bytes_per_s']))}/s"
    budget = state["write_budget_bytes_per_s"]
    if not state["enabled"]:
        rate += " (admission off: every store is written)"
    elif budget is None:
        rate += " (no write budget)"
    else:
        rate += (
            f" of a budget of {_size(int(budget))}/s (bucket "
            f"{100 * state['budget_level']:.0f} % full)"
        )
    rate += f", {state['drive_writes_per_day']:.2g} drive writes per day at that rate"
    stores = (
        f"  stores admitted {state['admitted']} ({_size(state['admitted_bytes'])}), "
        f"declined {state['declined']} ({_size(state['declined_bytes'])}; "
        f"{state['declined_for_budget']} for the budget)"
    )
    age = state["eviction_age_s"]
    if age is not None:
        stores += f"; objects lately last {age:.0f} s before eviction"
    return [f"  {rate}", stores]


def _rate(name: str, per_second: float) -> str:
    """``read_bytes`` -> "read 1.2 MiB/s"; ``lookup_keys`` -> "lookup keys 40/s"."""
    if name.endswith("_bytes"):
        return f"{name.removesuffix('_bytes')} {_size(int(per_second))}/s"
    return f"{name.replace('_', ' ')} {per_second:g}/s"


def _sessions(by_tenant: dict[str, int]) -> str:
    if not by_tenant:
        return "none"
    return ", ".join(f"{count} of tenant {tenant!r}" for tenant, count in by_tenant.items())
