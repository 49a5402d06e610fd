"""Figures and the markdown table of bench/backlog.py, from what its phases recorded.

Inputs: loads as ``(submitted_s, seconds)``; stores as ``(submitted_s, completed_s, ok)`` (the
flood processes' records, bench/backlog_flood.py, and the measuring session's own); the
gateway's queue samples as ``(time_s, queued_stores, store_backlog_bytes)``
(bench/backlog_gateway.py). All times are ``time.monotonic``, shared by every process.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from adp_gateway.config import GatewayConfig

GiB = 2**30
Load = tuple[float, float]
Store = Sequence[Any]  # submitted_s, completed_s, ok
Sample = tuple[float, int, int]


def latency_ms(seconds: Sequence[float]) -> dict[str, float]:
    """p50, p90 and max in milliseconds, and the number of samples."""
    if not seconds:
        return {"samples": 0}
    ms = np.asarray(seconds, dtype=np.float64) * 1e3
    return {
        "samples": len(seconds),
        "p50_ms": round(float(np.percentile(ms, 50)), 1),
        "p90_ms": round(float(np.percentile(ms, 90)), 1),
        "max_ms": round(float(ms.max()), 1),
    }


def at(samples: list[Sample], when: float) -> Sample:
    """The last queue sample taken at or before ``when`` (the queue as it then was)."""
    index = bisect.bisect_right([s[0] for s in samples], when) - 1
    return samples[index] if index >= 0 else (when, 0, 0)


def stores_summary(records: Sequence[Store]) -> dict[str, Any]:
    done = [r for r in records if r[2]]
    failed = [r for r in records if not r[2]]
    return {
        "stores": len(records),
        "ok": len(done),
        "failed": len(failed),
        "ok_latency": latency_ms([r[1] - r[0] for r in done]),
        "failed_latency": latency_ms([r[1] - r[0] for r in failed]),
    }


def backlog(
    idle: Sequence[Load],
    busy: Sequence[Load],
    samples: list[Sample],
    records: Sequence[Store],
    to_depth_s: float,
) -> dict[str, Any]:
    idle_ms, busy_ms = latency_ms([s for _, s in idle]), latency_ms([s for _, s in busy])
    depths = [at(samples, submitted) for submitted, _ in busy]
    return {
        "idle_load": idle_ms,
        "backlog_load": busy_ms,
        "ratio_p50": round(busy_ms["p50_ms"] / idle_ms["p50_ms"], 2),
        "ratio_p90": round(busy_ms["p90_ms"] / idle_ms["p90_ms"], 2),
        "target_ratio_max": 2.0,
        "backlog_gib_at_loads": _spread([d[2] / GiB for d in depths]),
        "queued_stores_at_loads": _spread([float(d[1]) for d in depths]),
        "backlog_gib_max": round(max((s[2] for s in samples), default=0) / GiB, 2),
        "seconds_to_depth": round(to_depth_s, 1),
        "flood": stores_summary(records),
    }


def fairness(
    loads: list[Load], stores: Sequence[Store], records: Sequence[Store], samples: list[Sample]
) -> dict[str, Any]:
    """For each store of the second session: the flood's stores queued when it was submitted,
    and how many of them completed while it waited (without turns: all of those)."""
    completed = sorted(r[1] for r in records)
    overtaken = [
        bisect.bisect_right(completed, done) - bisect.bisect_left(completed, submitted)
        for submitted, done, _ in stores
    ]
    return {
        "second_session_load": latency_ms([s for _, s in loads]),
        "second_session_store": latency_ms([s[1] - s[0] for s in stores]),
        "second_session_stores_ok": sum(1 for s in stores if s[2]),
        "flood_stores_queued_at_submit": [at(samples, s[0])[1] for s in stores],
        "flood_stores_completed_while_waiting": overtaken,
        "flood": stores_summary(records),
    }


def admission(records: Sequence[Store], samples: list[Sample], log_text: str) -> dict[str, Any]:
    return {
        "store_backlog_max_gib": GatewayConfig().store_backlog_max / GiB,
        "io_failures_in_gateway_log": len(re.findall(r"op \d+ failed", log_text)),
        "backlog_gib_max": round(max((s[2] for s in samples), default=0) / GiB, 2),
        **stores_summary(records),
    }


def pending(
    records: Sequence[Store], samples: list[Sample], outstanding_mib: int
) -> dict[str, Any]:
    return {
        "outstanding_mib": outstanding_mib,
        "window_mib": GatewayConfig().session_window_size // 2**20,
        "store_backlog_max_gib": GatewayConfig().store_backlog_max / GiB,
        "backlog_gib_max": round(max((s[2] for s in samples), default=0) / GiB, 2),
        **stores_summary(records),
    }


def _spread(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {
        "min": round(min(values), 2),
        "median": round(float(np.median(values)), 2),
        "max": round(max(values), 2),
    }


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    head = (
        f"{m['cpus']} CPUs, load average {m['loadavg_start'][0]:.2f} at start, "
        f"`{m['dir_filesystem']}`. "
        f"Objects of {report['object_mib']} MiB, {report.get('io_threads', 8)} I/O threads in the "
        "gateway; every client a real ADPConnector."
    )
    sections = [head]
    if "backlog" in report:
        sections.append(_backlog_section(report))
    if "one_session" in report:
        sections.append(_one_session_section(report["one_session"]))
    writers = {
        "fairness": _fairness_section,
        "admission": _admission_section,
        "pending": _pending_section,
    }
    sections += [write(report[name]) for name, write in writers.items() if name in report]
    return "\n\n".join(sections) + "\n"


def _backlog_section(report: dict[str, Any]) -> str:
    b = report["backlog"]
    return _section(
        f"Loads behind a store backlog ({report['flooders']} flood processes, windows of "
        f"{report['window_mib']} MiB)",
        "load of one object",
        [
            _row("idle gateway", b["idle_load"]),
            _row("behind the store backlog", b["backlog_load"]),
        ],
        f"Ratio: **{b['ratio_p50']}x at p50, {b['ratio_p90']}x at p90** (target at most 2x). "
        f"Store backlog queued in the gateway when each load was submitted: "
        f"{_gib(b['backlog_gib_at_loads'])} GiB ({_gib(b['queued_stores_at_loads'])} stores); "
        f"deepest seen {b['backlog_gib_max']} GiB, reached {b['seconds_to_depth']} s after "
        f"the floods started. Flood stores: {_stores(b['flood'])}.",
    )


def _one_session_section(o: dict[str, Any]) -> str:
    return _section(
        "Loads behind stores of the same session (as one LMCache server uses the plugin)",
        "load of one object",
        [
            _row("idle session", o["idle_load"]),
            _row("behind the session's own store backlog", o["backlog_load"]),
            _row("(the backlog's stores)", o["flood"]["ok_latency"], o["flood"]["ok"]),
        ],
        f"Ratio: **{o['ratio_p50']}x at p50, {o['ratio_p90']}x at p90** (target at most "
        f"{o['target_ratio_max']}x at p50). Store backlog queued in the gateway when each load "
        f"was submitted: {_gib(o['backlog_gib_at_loads'])} GiB "
        f"({_gib(o['queued_stores_at_loads'])} stores); the rest of the session's stores wait "
        f"in the plugin (its window and pending_store_bytes_max bound them). Backlog stores: "
        f"{_stores(o['flood'])}.",
    )


def _fairness_section(f: dict[str, Any]) -> str:
    return _section(
        "Fairness: a second session while one session floods stores",
        "second session",
        [
            _row("load", f["second_session_load"]),
            _row("store", f["second_session_store"]),
            _row("(the flood's own stores)", f["flood"]["ok_latency"]),
        ],
        f"Flood stores queued when each of the second session's stores was submitted: "
        f"{f['flood_stores_queued_at_submit']}; flood stores that completed while it waited: "
        f"{f['flood_stores_completed_while_waiting']}.",
    )


def _admission_section(a: dict[str, Any]) -> str:
    title = f"Admission control (default store_backlog_max, {a['store_backlog_max_gib']:g} GiB)"
    note = (
        f"Deepest store backlog in the gateway: {a['backlog_gib_max']} GiB; I/O failures in "
        f"its log: {a['io_failures_in_gateway_log']} (every other failure is a refusal)."
    )
    labels = ("accepted (submit to completion)", "refused (submit to failed completion)")
    return _stores_section(title, a, labels, note)


def _pending_section(p: dict[str, Any]) -> str:
    title = (
        f"Default settings: {p['outstanding_mib']} MiB of stores out from one client "
        f"({p['window_mib']} MiB window)"
    )
    note = (
        f"Deepest store backlog in the gateway: {p['backlog_gib_max']} GiB of the "
        f"{p['store_backlog_max_gib']:g} GiB bound; the rest waited in the plugin's pending queue."
    )
    labels = ("completed ok (LMCache's buffer held this long)", "failed")
    return _stores_section(title, p, labels, note)


def _stores_section(title: str, summary: dict[str, Any], labels: tuple[str, str], note: str) -> str:
    rows = [
        _row(labels[0], summary["ok_latency"], summary["ok"]),
        _row(labels[1], summary["failed_latency"], summary["failed"]),
    ]
    return _section(title, "stores", rows, note)


def _section(title: str, first_column: str, rows: list[str], note: str) -> str:
    header = f"| {first_column} | count | p50 ms | p90 ms | max ms |\n|---|---|---|---|---|"
    return f"## {title}\n\n{header}\n" + "\n".join(rows) + f"\n\n{note}"


def _row(what: str, latency: dict[str, float], count: int | None = None) -> str:
    n = latency.get("samples", 0) if count is None else count
    cells = [latency.get(k, "-") for k in ("p50_ms", "p90_ms", "max_ms")]
    return f"| {what} | {n} | " + " | ".join(str(c) for c in cells) + " |"


def _gib(spread: dict[str, float]) -> str:
    return f"{spread.get('min', 0)}-{spread.get('max', 0)} (median {spread.get('median', 0)})"


def _stores(summary: dict[str, Any]) -> str:
    return f"{summary['ok']} ok, {summary['failed']} failed"
