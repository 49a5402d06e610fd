"""Goal: the bounds report (bench/trace_bounds.py) tells first reuses from later ones right, runs
the gateway's own admission and ranking at the fixed bar and aging it is given, and reports a
grid cell per pair: second sighting never hits a first reuse, Belady with room for everything
hits every one, an aging of 1 ranks as LRU does, and a cache with room for everything hits every
reuse at a bar of 0 whatever the aging."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from adp_gateway.card.software.victims import Ranking
from bench.trace_bounds import first_reuses, gateway_settings, main
from bench.trace_file import Trace, read_trace
from bench.trace_sim import replay_belady, replay_gateway
from tests.support.synthetic_trace import conversations, write_trace

BLOCK_BYTES = 1000


@pytest.fixture
def trace_path(tmp_path: Path) -> Path:
    return write_trace(tmp_path / "trace.jsonl", conversations(40, 4, 3, 30.0, seed=5))


def _hits(trace: Trace, capacity: int, bar: float, factor: float) -> npt.NDArray[np.bool_]:
    hit = np.zeros(trace.references, bool)
    settings = gateway_settings(capacity, BLOCK_BYTES, bar)
    ranking = Ranking.SCAN_RESISTANT
    replay_gateway(
        trace, capacity, 4, ranking, settings, BLOCK_BYTES, unread_age_factor=factor, hit=hit
    )
    return hit


def test_a_first_reuse_is_a_blocks_second_reference(tmp_path: Path) -> None:
    path = write_trace(
        tmp_path / "t.jsonl",
        [
            {"timestamp": t, "input_length": 1024, "output_length": 1, "hash_ids": ids}
            for t, ids in enumerate([[0, 1], [0, 1], [0, 2], [0, 3]])
        ],
    )
    assert first_reuses(read_trace(path)).tolist() == [0, 0, 1, 1, 0, 0, 0, 0]


def test_second_sighting_hits_no_first_reuse_and_belady_with_room_hits_each(
    trace_path: Path,
) -> None:
    trace = read_trace(trace_path)
    first = first_reuses(trace)
    hit = _hits(trace, trace.distinct // 2, bar=1.0, factor=1.6)
    assert hit.any() and not (hit & first).any()
    belady = np.zeros(trace.references, bool)
    hits, _ = replay_belady(trace, trace.distinct, belady)
    assert int(belady.sum()) == hits and (belady | ~first).all()


def test_an_aging_of_one_ranks_as_lru(trace_path: Path) -> None:
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
    assert aged == lru != faster


def test_the_report_has_a_cell_per_bar_and_aging(trace_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "bounds"
    argv = [str(trace_path), "--capacities", "10,100", "--bars", "0,1", "--factors", "1,4"]
    assert main([*argv, "--out", str(out)]) == 0
    report = json.loads(out.with_suffix(".json").read_text())
    trace = read_trace(trace_path)
    everything = report["capacities"][1]
    assert [len(row["grid"]) for row in report["capacities"]] == [4, 4]
    reuses = trace.references - trace.distinct
    assert everything["belady"]["hits"] == reuses
    assert [c["hits"] for c in everything["grid"] if c["bar"] == 0] == [reuses, reuses]
    assert "| 10 % |" in out.with_suffix(".md").read_text()
