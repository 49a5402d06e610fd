"""The markdown tables of bench/matrix.py's report: MB/s with ratios, and CPU per GB of each
process beside every figure."""

from __future__ import annotations

from typing import Any

from bench import floor, odirect
from bench.gateways import contender_settings

RAM_L2 = "lmcache-ram"
FS_LABELS = {
    "fs-odirect": "fs_native O_DIRECT",
    "fs-buffered": "fs_native buffered",
    RAM_L2: "LMCache alone (fs_native on RAM)",
}


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    sync = report["defaults"]["sync"]
    parts = [
        f"{m['cpus']} CPUs, load average {_load(m.get('loadavg_start'))} at start and "
        f"{_load(m.get('loadavg_end'))} at the end, `{m['dir_filesystem']}`. "
        'MB/s = 10^6 bytes/s; medians over the repeats; "ours" is lmcache-adp with every '
        f"setting its default (sync `{sync}`), other rows name what differs.",
    ]
    checks = report.get("odirect", [])
    if checks:
        parts += ["", *(f"- {odirect.line(check)}" for check in checks)]
    parts += [
        "",
        "## Throughput, MB/s",
        "",
        throughput_table(report),
        "",
        "## Each contender: MB/s and CPU seconds per GB of each process",
        "",
        "CPU over the harness's rounds: the harness process is LMCache's `lmcache bench l2` with "
        "the adapter in it (our plugin, or fs_native's C++ workers); the gateway is ours only.",
        "",
        contender_table(report),
    ]
    if not any(k in report for k in ("floor_before", "floor_after")):
        parts += ["", "No floor: it is measured with O_DIRECT, which `--dir` refuses."]
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


def throughput_table(report: dict[str, Any]) -> str:
    """One row per cell and operation, a column per contender, then ours over the others."""
    names, ours = _contenders(report), _ours(report)
    sync = report["defaults"]["sync"]
    ratios = [f"{_label(ours, sync)} / {_label(n, sync)}" for n in _references(names)]
    has_floor = _has_floor(report)
    if has_floor:
        ratios += ["/ floor's best", "/ floor at the gateway's shape"]
    header = " | ".join(_label(n, sync) for n in names)
    lines = [
        f"| object | keys x in flight | op | {header} | " + " | ".join(ratios) + " |",
        "|---|---|---|" + "---|" * (len(names) + len(ratios)),
    ]
    for cell in report["cells"]:
        load, medians = cell["load"], cell["medians"]
        for op, direction in (("store", "write"), ("load", "read")):
            cells = [_mbps(_figure(medians, n, op), _done(medians, n, op)) for n in names]
            mine = _figure(medians, ours, op)
            row = [_ratio(mine, _figure(medians, n, op)) for n in _references(names)]
            if has_floor:
                floors = best_floor(report, load["size_kb"] * 1024)
                row.append(_ratio(mine, floors[f"best_{direction}_GBps"] * 1e3))
                row.append(_ratio(mine, floors[f"gateway_shape_{direction}_GBps"] * 1e3))
            lines.append(
                f"| {_size(load['size_kb'])} | {load['keys']} x {load['in_flight']} | {op} | "
                + " | ".join(cells + row)
                + " |"
            )
    return "\n".join(lines)


def contender_table(report: dict[str, Any]) -> str:
    """One row per cell, operation and contender: its MB/s, the CPU seconds per GB of the
    harness process and of the gateway, and its MB/s over fs_native's and LMCache alone's."""
    names, sync = _contenders(report), report["defaults"]["sync"]
    references = _references(names)
    lines = [
        "| object | keys x in flight | op | contender | MB/s | harness CPU s/GB "
        "| gateway CPU s/GB | "
        + "".join(f"/ {_label(n, sync)} | " for n in references)
        + "database written once before the stores |",
        "|---|---|---|---|---|---|---|" + "---|" * len(references) + "---|",
    ]
    for cell in report["cells"]:
        load, medians = cell["load"], cell["medians"]
        for op in ("store", "load"):
            for name in names:
                figures = medians.get(name, {}).get(op, {})
                mine = figures.get("MBps")
                ratios = [_ratio(mine, _figure(medians, n, op)) for n in references]
                lines.append(
                    f"| {_size(load['size_kb'])} | {load['keys']} x {load['in_flight']} | {op} "
                    f"| {_label(name, sync)} | {_mbps(mine, figures.get('succeeded', 1.0))} "
                    f"| {_num(figures.get('client_cpu_s_per_GB'))} "
                    f"| {_num(figures.get('gateway_cpu_s_per_GB'))} | "
                    + "".join(f"{r} | " for r in ratios)
                    + f"{_prepared(cell, name) if op == 'store' else ''} |"
                )
    return "\n".join(lines)


def _prepared(cell: dict[str, Any], name: str) -> str:
    """In how many of the contender's runs the gateway had written its new database once
    before the stores began (card/software/devices/preparer.py)."""
    prepared = [r["store"].get("prepared_before") for r in cell["runs"].get(name, [])]
    known = [p for p in prepared if p is not None]
    return f"{int(sum(known))} of {len(known)} runs" if known else ""


def best_floor(report: dict[str, Any], object_bytes: int) -> dict[str, float]:
    """The better of the floors measured before and after the cells, per figure."""
    found = [
        floor.for_size(report[k], object_bytes)
        for k in ("floor_before", "floor_after")
        if k in report
    ]
    return {key: max(f[key] for f in found) for key in found[0]}


def _has_floor(report: dict[str, Any]) -> bool:
    return any(k in report for k in ("floor_before", "floor_after"))


def _contenders(report: dict[str, Any]) -> list[str]:
    return str(report["settings"]["contenders"]).split(",")


def _ours(report: dict[str, Any]) -> str:
    """The contender the ratios are of: ours with every default, else the first of ours."""
    names = _contenders(report)
    default = f"adp-{report['defaults']['sync']}"
    return default if default in names else next((n for n in names if n.startswith("adp-")), "")


def _references(names: list[str]) -> list[str]:
    """What ours is compared with: fs_native O_DIRECT, and LMCache alone when it ran."""
    return ["fs-odirect"] + [n for n in (RAM_L2,) if n in names]


def _label(name: str, default_sync: str) -> str:
    """``adp-periodic@databases_per_dir=2;io_threads=16`` reads "ours, 2 databases,
    io_threads=16"; fs_native's and LMCache's contenders their names."""
    if name in FS_LABELS:
        return FS_LABELS[name]
    policy, extra = contender_settings(name.removeprefix("adp-"))
    parts = ["ours"]
    if policy != default_sync:
        parts.append(f"sync {policy}")
    databases = extra.pop("databases_per_dir", None)
    if databases is not None:
        parts.append(f"{databases} database{'' if databases == 1 else 's'}")
    parts += [f"{key}={value}" for key, value in extra.items()]
    return ", ".join(parts)


def _figure(medians: dict[str, Any], name: str, op: str) -> float | None:
    value = medians.get(name, {}).get(op, {}).get("MBps")
    return None if value is None else float(value)


def _done(medians: dict[str, Any], name: str, op: str) -> float:
    return float(medians.get(name, {}).get(op, {}).get("succeeded", 1.0))


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
