"""The markdown tables of bench/matrix.py's report: MB/s with ratios, and CPU per GB."""

from __future__ import annotations

from typing import Any

from bench import floor

POLICIES = ("always", "periodic", "none")


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    default = f"adp-{report['defaults']['sync']}"
    parts = [
        "# lmcache-adp against fs_native through `lmcache bench l2`, and the disk's floor",
        "",
        f"`{report['command']}` — {report['started']}, commit {m['commit']}, {m['cpus']} CPUs, "
        f"load average {_load(m.get('loadavg_start'))} at start and "
        f"{_load(m.get('loadavg_end'))} at the end, `{m['dir_filesystem']}`. "
        "MB/s = 10^6 bytes/s; medians over the repeats; the default sync policy is "
        f"`{report['defaults']['sync']}`.",
        "",
        "## Throughput, MB/s",
        "",
        throughput_table(report, default),
        "",
        "## CPU seconds per GB moved (over the harness's rounds)",
        "",
        cpu_table(report, default),
    ]
    for key, title in (("floor_before", "before the cells"), ("floor_after", "after the cells")):
        if key in report:
            parts += ["", f"## Floor {title} (bench/floor.py)", "", floor.table(report[key])]
    for skipped in report["skipped"]:
        load = skipped["load"]
        parts.append(f"\nSkipped {_cell(load)}: {skipped['why']}.")
    for cell in report["cells"]:
        if "failed" in cell:
            parts.append(f"\n**{_cell(cell['load'])} failed**: `{cell['failed'][-300:]}`")
    return "\n".join(parts) + "\n"


def throughput_table(report: dict[str, Any], default: str) -> str:
    names = _contenders(report)
    header = " | ".join(_label(n) for n in names)
    lines = [
        f"| object | keys x in flight | op | {header} | {_label(default)} / fs_native O_DIRECT "
        "| / fio best | / fio at the gateway's shape |",
        "|---|---|---|" + "---|" * len(names) + "---|---|---|",
    ]
    for cell in report["cells"]:
        load, medians = cell["load"], cell["medians"]
        floors = best_floor(report, load["size_kb"] * 1024)
        for op, direction in (("store", "write"), ("load", "read")):
            values = [medians.get(n, {}).get(op, {}).get("MBps") for n in names]
            ours = medians.get(default, {}).get(op, {}).get("MBps")
            fs = medians.get("fs-odirect", {}).get(op, {}).get("MBps")
            best = floors[f"best_{direction}_GBps"] * 1e3
            shape = floors[f"gateway_shape_{direction}_GBps"] * 1e3
            done = [medians.get(n, {}).get(op, {}).get("succeeded", 1.0) for n in names]
            cells = [_mbps(v, f) for v, f in zip(values, done, strict=True)]
            ratios = [_ratio(ours, fs), _ratio(ours, best), _ratio(ours, shape)]
            lines.append(
                f"| {_size(load['size_kb'])} | {load['keys']} x {load['in_flight']} | {op} | "
                + " | ".join(cells + ratios)
                + " |"
            )
    return "\n".join(lines)


def cpu_table(report: dict[str, Any], default: str) -> str:
    names = _contenders(report)
    ours = [n for n in names if n.startswith("adp-")]
    lines = [
        "| object | keys x in flight | op | gateway: "
        + ", ".join(n.removeprefix("adp-") for n in ours)
        + " | harness process (LMCache + adapter): "
        + ", ".join(_label(n) for n in names)
        + f" | {_label(default)}: database written once before the stores |",
        "|---|---|---|---|---|---|",
    ]
    for cell in report["cells"]:
        load, medians = cell["load"], cell["medians"]
        for op in ("store", "load"):
            gateway = [medians.get(n, {}).get(op, {}).get("gateway_cpu_s_per_GB") for n in ours]
            client = [medians.get(n, {}).get(op, {}).get("client_cpu_s_per_GB") for n in names]
            runs = cell["runs"].get(default, [])
            prepared = [r["store"].get("prepared_before") for r in runs] if op == "store" else []
            known = [p for p in prepared if p is not None]
            note = f"{int(sum(known))} of {len(known)} runs" if known else ""
            lines.append(
                f"| {_size(load['size_kb'])} | {load['keys']} x {load['in_flight']} | {op} | "
                f"{' / '.join(_num(v) for v in gateway)} | {' / '.join(_num(v) for v in client)} "
                f"| {note} |"
            )
    return "\n".join(lines)


def best_floor(report: dict[str, Any], object_bytes: int) -> dict[str, float]:
    """The better of the floors measured before and after the cells, per figure."""
    found = [
        floor.for_size(report[k], object_bytes)
        for k in ("floor_before", "floor_after")
        if k in report
    ]
    return {key: max(f[key] for f in found) for key in found[0]}


def _contenders(report: dict[str, Any]) -> list[str]:
    return str(report["settings"]["contenders"]).split(",")


def _label(name: str) -> str:
    labels = {"fs-odirect": "fs_native O_DIRECT", "fs-buffered": "fs_native buffered"}
    return labels.get(name, f"adp sync {name.removeprefix('adp-')}")


def _cell(load: dict[str, Any]) -> str:
    return f"{_size(load['size_kb'])} x {load['keys']} keys x {load['in_flight']} in flight"


def _size(size_kb: int) -> str:
    return f"{size_kb // 1024} MiB" if size_kb % 1024 == 0 else f"{size_kb} KiB"


def _mbps(value: float | None, succeeded: float = 1.0) -> str:
    """MB/s; with the share of keys that succeeded when some did not (refused stores, and the
    misses they leave for the loads)."""
    if value is None:
        return "-"
    return f"{value:.0f}" if succeeded >= 1.0 else f"{value:.0f} ({succeeded:.0%} of keys)"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _ratio(top: float | None, bottom: float | None) -> str:
    return "-" if top is None or not bottom else f"{top / bottom:.2f}"


def _load(values: list[float] | None) -> str:
    return "?" if not values else f"{values[0]:.1f}"
