"""Goal: the bounds report (bench/trace_bounds.py) tells first reuses from later ones right, marks
the very references that hit, runs the gateway's own admission and ranking at the fixed bar and
aging it is given, and reports the grid's best cell: second sighting never hits a first reuse,
Belady with room for everything hits every one, an aging of 1 ranks as LRU does and a faster one
differently, a bar held at 0 writes what writing everything writes even where the card's
pressure would raise it, and the report's counts add up to the trace's references."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from adp_gateway.card.software.victims import Ranking
from adp_gateway.policy.admission import AdmissionSettings
from bench.trace_bounds import first_reuses, gateway_settings, main
from bench.trace_file import Trace, read_trace
from bench.trace_sim import replay_belady, replay_gateway
from tests.support.synthetic_trace import conversations, write_trace

BLOCK_BYTES = 1000


@pytest.fixture
def trace_path(tmp_path: Path) -> Path:
    return write_trace(tmp_path / "trace.jsonl", conversations(40, 4, 3, 30.0, seed=5))


def _gateway(
    trace: Trace, capacity: int, bar: float, factor: float
) -> tuple[npt.NDArray[np.bool_], int]:
    """Which references hit, and how many did."""
    hit = np.zeros(trace.references, bool)
    settings = gateway_settings(capacity, BLOCK_BYTES, bar)
    ranking = Ranking.SCAN_RESISTANT
    hits, _ = replay_gateway(
        trace, capacity, 4, ranking, settings, BLOCK_BYTES, unread_age_factor=factor, hit=hit
    )
    return hit, hits


def _repeats(trace: Trace) -> npt.NDArray[np.bool_]:
    """Every reference but each block's first."""
    _, first = np.unique(trace.blocks, return_index=True)
    repeat = np.ones(trace.references, bool)
    repeat[first] = False
    return repeat


def test_a_first_reuse_is_a_blocks_second_reference(tmp_path: Path) -> None:
    path = write_trace(
        tmp_path / "t.jsonl",
        [
            {"timestamp": t, "input_length": 1024, "output_length": 1, "hash_ids": ids}
            for t, ids in enumerate([[0, 1], [0, 1], [0, 2], [0, 3]])
        ],
    )
    assert first_reuses(read_trace(path)).tolist() == [0, 0, 1, 1, 0, 0, 0, 0]


def test_the_masks_mark_the_very_references_that_hit(trace_path: Path) -> None:
    """With room for everything and every store written, the references that hit are exactly
    every block's repeats; in a small cache the mask counts what the replay counts."""
    trace = read_trace(trace_path)
    hit, hits = _gateway(trace, trace.distinct, bar=0.0, factor=1.6)
    assert (hit == _repeats(trace)).all() and hits == int(hit.sum())
    belady = np.zeros(trace.references, bool)
    assert replay_belady(trace, trace.distinct, belady)[0] == int(belady.sum())
    assert (belady == _repeats(trace)).all()
    small, small_hits = _gateway(trace, trace.distinct // 2, bar=0.0, factor=1.6)
    assert 0 < small_hits == int(small.sum()) < hits


def test_second_sighting_hits_no_first_reuse(trace_path: Path) -> None:
    trace = read_trace(trace_path)
    hit, _ = _gateway(trace, trace.distinct // 2, bar=1.0, factor=1.6)
    assert hit.any() and not (hit & first_reuses(trace)).any()


def test_an_aging_of_one_ranks_as_lru_and_a_faster_one_hits_more_here(trace_path: Path) -> None:
    """At half the distinct blocks, where an aging of 4 hits more."""
    trace = read_trace(trace_path)
    capacity = trace.distinct // 2
    settings = gateway_settings(capacity, BLOCK_BYTES, 0.0)
    lru = replay_gateway(trace, capacity, 4, Ranking.LRU, settings, BLOCK_BYTES)
    aged = replay_gateway(
        trace, capacity, 4, Ranking.SCAN_RESISTANT, settings, BLOCK_BYTES, unread_age_factor=1.0
    )
    faster = replay_gateway(
        trace, capacity, 4, Ranking.SCAN_RESISTANT, settings, BLOCK_BYTES, unread_age_factor=4.0
    )
    assert aged == lru and faster[0] > aged[0]


def test_a_bar_held_at_zero_writes_everything_under_pressure(trace_path: Path) -> None:
    """At an eighth of the distinct blocks the gateway's own bar rises and writes less."""
    trace = read_trace(trace_path)
    capacity = trace.distinct // 8
    ranking = Ranking.LRU

    def writes(settings: AdmissionSettings) -> int:
        return replay_gateway(trace, capacity, 4, ranking, settings, BLOCK_BYTES)[1]

    everything = writes(AdmissionSettings(enabled=False))
    assert writes(gateway_settings(capacity, BLOCK_BYTES, 0.0)) == everything
    assert writes(gateway_settings(capacity, BLOCK_BYTES, None)) < everything


def test_the_report_adds_up_and_names_the_grids_best_cell(trace_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "bounds"
    argv = [str(trace_path), "--capacities", "10,100", "--bars", "0,1", "--factors", "1,4"]
    assert main([*argv, "--out", str(out)]) == 0
    report = json.loads(out.with_suffix(".json").read_text())
    trace = read_trace(trace_path)
    reuses = trace.references - trace.distinct
    for row in report["capacities"]:
        assert len(row["grid"]) == 4
        assert row["first_reuses"] + row["later_reuses"] == reuses
    everything = report["capacities"][1]
    assert (
        everything["belady"]["hits"]
        == everything["belady"]["first_reuse_hits"] + (everything["later_reuses"])
    )
    assert [c["hits"] for c in everything["grid"] if c["bar"] == 0] == [reuses, reuses]
    text = out.with_suffix(".md").read_text()
    for row in report["capacities"]:
        best = max(row["grid"], key=lambda cell: cell["hits"])
        assert min(c["hits"] for c in row["grid"]) < best["hits"]
        line = next(
            x for x in text.splitlines() if x.startswith(f"| {row['capacity_percent']:g} %")
        )
        assert f"| {100 * best['hits'] / trace.references:.2f} (" in line
        assert line.endswith(f"| {best['bar']:g}, {best['unread_age_factor']:g} |")
