"""Goal: bench/results/ holds results only, one per benchmark and machine, each Markdown exactly
what `python -m bench.results` renders from its JSON, so a figure in a Markdown cannot drift
from the JSON it came from, and nothing else (a patch, a script, a run named by its commit)
lands among them."""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import pytest

from bench import results

COMMITTED = sorted(results.RESULTS.glob("*.json"))


@functools.cache
def rendered() -> dict[Path, str]:
    return results.render_all()


def test_every_file_in_bench_results_is_a_result() -> None:
    assert len(COMMITTED) >= 10
    assert results.problems() == []


@pytest.mark.parametrize("path", COMMITTED, ids=[p.stem for p in COMMITTED])
def test_each_markdown_is_what_its_json_renders(path: Path) -> None:
    # `python -m bench.results` rewrites it; commit the JSON and the Markdown together.
    assert path.with_suffix(".md").read_text() == rendered()[path.with_suffix(".md")]


def test_the_check_names_what_is_not_a_result(tmp_path: Path) -> None:
    good = results.RESULTS / "restart-vm.json"
    shutil.copy(good, tmp_path)
    shutil.copy(good.with_suffix(".md"), tmp_path)
    assert results.problems(tmp_path) == []
    (tmp_path / "alternate.sh").write_text("#!/bin/sh\n")
    shutil.copy(good, tmp_path / "restart-7fc5da2.json")  # named by commit, not machine
    shutil.copy(good, tmp_path / "matrix-256k-vm.json")  # a variant nobody declared
    shutil.copy(good, tmp_path / "matrix-vm.json")  # a restart's JSON under the matrix's name
    (tmp_path / "matrix-vm.md").write_text("")
    (tmp_path / "old").mkdir()
    found = " ".join(results.problems(tmp_path))
    for name in ("alternate.sh", "restart-7fc5da2", "matrix-256k-vm", "old"):
        assert name in found
    assert "matrix-vm.json: its benchmark is 'restart'" in found


def test_the_check_names_a_json_without_its_stamp_or_markdown(tmp_path: Path) -> None:
    report = json.loads((results.RESULTS / "restart-vm.json").read_text())
    del report["commit"]
    (tmp_path / "restart-vm.json").write_text(json.dumps(report))
    (tmp_path / "restart-vm.md").write_text("")
    (tmp_path / "exists-vm.md").write_text("")
    found = " ".join(results.problems(tmp_path))
    assert "restart-vm.json: no commit" in found
    assert "exists-vm: has ['.md']" in found


def test_a_changed_figure_makes_its_markdown_out_of_date(tmp_path: Path) -> None:
    source = results.RESULTS / "restart-vm.json"
    shutil.copy(source.with_suffix(".md"), tmp_path)
    report = json.loads(source.read_text())
    assert "1.28 s" in source.with_suffix(".md").read_text()
    report["KILL"]["launch_to_first_hit_s"] = 9.99
    (tmp_path / "restart-vm.json").write_text(json.dumps(report))
    assert results.main(["--check", "--dir", str(tmp_path)]) == 1
    assert results.main(["--dir", str(tmp_path)]) == 0  # rewrites it
    assert "9.99 s" in (tmp_path / "restart-vm.md").read_text()
    assert results.main(["--check", "--dir", str(tmp_path)]) == 0


def test_write_stamps_the_report_and_renders_it(tmp_path: Path) -> None:
    report = {"command": "python -m bench.floor --dir D", "loadavg": [0.1, 0.1, 0.1]}
    report["floor"] = json.loads((results.RESULTS / "floor-h100.json").read_text())["floor"]
    written = results.write(tmp_path / "floor-vm", "floor", report)
    assert list(written)[:4] == ["benchmark", "command", "commit", "date"]
    assert written["benchmark"] == "floor" and written["commit"] and written["date"]
    assert json.loads((tmp_path / "floor-vm.json").read_text()) == written
    markdown = (tmp_path / "floor-vm.md").read_text()
    assert results.MACHINES["vm"] in markdown
    assert "The floor's best (fio or the Python probe)" in markdown
    assert results.problems(tmp_path) == []
