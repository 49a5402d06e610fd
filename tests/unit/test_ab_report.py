"""Goal: an A/B's verdict (bench/ab_report.py) is each side's median over its rounds, taken from
the rounds' own reports, so a slower new side shows as a ratio under 1 and a slower lookup as a
higher percentile."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.ab_report import compare, markdown


def matrix_round(commit: str, store_speeds: list[float]) -> dict[str, Any]:
    point = {"size_kb": 4096, "keys": 32, "in_flight": 4}
    runs = [{"store": {"MBps": s}, "load": {"MBps": 2 * s}} for s in store_speeds]
    return {
        "benchmark": "matrix",
        "command": "python -m bench.matrix",
        "commit": commit,
        "cells": [{"load": point, "runs": {"adp": runs}}],
    }


def write_rounds(folder: Path, side: str, reports: list[dict[str, Any]]) -> None:
    for number, report in enumerate(reports, 1):
        (folder / f"{side}-r{number}.json").write_text(json.dumps(report))


def test_the_matrix_verdict_is_the_median_over_rounds_of_each_rounds_median(
    tmp_path: Path,
) -> None:
    base = [matrix_round("aaa", s) for s in ([100, 110, 90], [120] * 3)]
    for report in base:  # an older bench's report names its commit under "machine" only
        report["machine"] = {"commit": report.pop("commit")}
    write_rounds(tmp_path, "base", base)
    write_rounds(tmp_path, "new", [matrix_round("bbb", s) for s in ([50, 60, 55], [70] * 3)])
    report = compare(tmp_path)
    rows = {row["figure"]: row for row in report["rows"]}
    store = rows["4096 KiB x 32 keys, 4 in flight: adp store MB/s"]
    assert store["base_rounds"] == [100, 120] and store["new_rounds"] == [55, 70]
    assert store["base"] == 110 and store["new"] == 62.5
    assert round(store["new_over_base"], 3) == round(62.5 / 110, 3)
    assert rows["4096 KiB x 32 keys, 4 in flight: adp load MB/s"]["base"] == 220
    assert (report["base_commit"], report["new_commit"], report["rounds"]) == ("aaa", "bbb", 2)
    assert "| 110.0 | 62.5 | 0.57 |" in markdown(report)


def test_the_lookup_verdict_compares_each_percentile(tmp_path: Path) -> None:
    def lookup_round(commit: str, busy_p99: float) -> dict[str, Any]:
        summary = {"idle_p50_ms": 1.5, "idle_p99_ms": 3.0, "busy_p50_ms": 2.0}
        return {
            "benchmark": "lookup_under_load",
            "command": "python -m bench.lookup_under_load",
            "commit": commit,
            "summary": {"ours": summary | {"busy_p99_ms": busy_p99}},
        }

    write_rounds(tmp_path, "base", [lookup_round("aaa", p) for p in (5.0, 6.0, 7.0)])
    write_rounds(tmp_path, "new", [lookup_round("bbb", p) for p in (9.0, 8.0, 10.0)])
    rows = {row["figure"]: row for row in compare(tmp_path)["rows"]}
    assert (rows["ours busy_p99_ms"]["base"], rows["ours busy_p99_ms"]["new"]) == (6.0, 9.0)
    assert rows["ours idle_p50_ms"]["new_over_base"] == 1.0
