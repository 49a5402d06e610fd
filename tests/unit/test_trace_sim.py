"""Goal: the offline simulator (bench/trace_sim.py) applies LMCache's prefix rule and its
reference policies right, and runs the gateway's own policy code: a cache that never evicts
hits every reference but each block's first; on conversations Belady hits no less than LRU
(under the prefix rule it is not a bound on every trace); second sighting writes only blocks
seen before, the oracle only blocks read again, the frequency bound only the blocks used most;
a block past a request's first miss is not a hit even when held; the gateway's policies run over
regions and report their writes; a trace is read as LMCache sees it (whole blocks only), and the
requests of one timestamp can be spread over its step; and a trace file that is not in the
Mooncake format is refused naming its line."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from bench.trace_file import read_trace
from bench.trace_sim import main, replay_belady, replay_lru, replay_top_frequency, run_policy
from tests.support.synthetic_trace import conversations, write_trace


@pytest.fixture
def trace_path(tmp_path: Path) -> Path:
    return write_trace(tmp_path / "trace.jsonl", conversations(40, 4, 3, 30.0, seed=3))


def test_a_cache_that_never_evicts_hits_all_but_each_first_reference(trace_path: Path) -> None:
    trace = read_trace(trace_path)
    hits, writes = replay_lru(trace, capacity=trace.distinct)
    assert hits == trace.references - trace.distinct and writes == trace.distinct
    assert replay_belady(trace, trace.distinct)[0] == hits


def test_belady_hits_at_least_lru_and_second_sighting_writes_less(trace_path: Path) -> None:
    trace = read_trace(trace_path)
    for capacity in (5, 20, 80):
        lru_hits, lru_writes = replay_lru(trace, capacity)
        assert replay_belady(trace, capacity)[0] >= lru_hits
        assert replay_lru(trace, capacity, admit_seen_only=True)[1] < lru_writes


def test_the_oracle_writes_only_blocks_read_again(trace_path: Path) -> None:
    trace = read_trace(trace_path)
    again = sum(1 for n in Counter(trace.blocks.tolist()).values() if n > 1)
    assert replay_lru(trace, trace.distinct, oracle=True) == (
        trace.references - trace.distinct,
        again,
    )


def test_top_frequency_holds_the_blocks_used_most_and_no_more(tmp_path: Path) -> None:
    """Block 0 is in every request and block 1 in two: with room for one block, only block 0 is
    written, and it hits in each request after the first; with room for all, every repeat
    hits."""
    path = write_trace(
        tmp_path / "t.jsonl",
        [
            {"timestamp": t, "input_length": 1024, "output_length": 1, "hash_ids": ids}
            for t, ids in enumerate([[0, 1], [0, 1], [0, 2], [0, 3]])
        ],
    )
    trace = read_trace(path)
    assert replay_top_frequency(trace, 1) == (3, 1)
    assert replay_top_frequency(trace, trace.distinct) == replay_lru(trace, trace.distinct)


def test_only_a_requests_prefix_hits(tmp_path: Path) -> None:
    """Block 2 is held but block 1 before it is not: the second request hits block 0 only."""
    path = write_trace(
        tmp_path / "t.jsonl",
        [
            {"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [0, 2]},
            {"timestamp": 1, "input_length": 1536, "output_length": 1, "hash_ids": [0, 1, 2]},
        ],
    )
    assert replay_lru(read_trace(path), capacity=10) == (1, 3)


def test_the_gateways_policies_run_over_regions(trace_path: Path) -> None:
    trace = read_trace(trace_path)
    everything = run_policy("region-lru", trace, 50.0, 4, 1000, 0.25, 60.0)
    ours = run_policy("ours", trace, 50.0, 4, 1000, 0.25, 60.0)
    budget = run_policy("ours-budget", trace, 50.0, 4, 1000, 0.25, 60.0, everything.bytes_written)
    assert everything.blocks_written >= trace.distinct  # every block, and again once evicted
    assert 0 < ours.hits <= trace.references - trace.distinct
    assert run_policy("ours-lfu", trace, 50.0, 4, 1000, 0.25, 60.0).hits > 0
    assert budget.blocks_written < everything.blocks_written


def test_the_report_has_a_row_per_capacity(trace_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "sim"
    assert main([str(trace_path), "--capacities", "10,50", "--out", str(out)]) == 0
    text = out.with_suffix(".md").read_text()
    assert "| 10 % |" in text and "| 50 % |" in text and "belady" in text


def test_a_trace_is_read_as_lmcache_sees_it_whole_blocks_only(tmp_path: Path) -> None:
    """LMCache stores whole chunks only: a prompt's partial last block is no reference, and a
    prompt shorter than one block no request; a line without ``input_length`` keeps its blocks."""
    path = write_trace(
        tmp_path / "t.jsonl",
        [
            {"timestamp": 0, "input_length": 1100, "output_length": 1, "hash_ids": [0, 1, 2]},
            {"timestamp": 1, "input_length": 300, "output_length": 1, "hash_ids": [3]},
            {"timestamp": 2, "input_length": 1024, "output_length": 1, "hash_ids": [0, 4]},
            {"timestamp": 3, "hash_ids": [0, 4, 5]},
        ],
    )
    trace = read_trace(path)
    assert trace.requests == 3
    assert [trace.request(i) for i in range(3)] == [[0, 1], [0, 4], [0, 4, 5]]


def test_requests_of_one_timestamp_spread_evenly_over_its_step(tmp_path: Path) -> None:
    """Mooncake's timestamps come in steps of about 3 s; the last step spreads over the median
    one."""
    stamps = [0, 0, 0, 3000, 6000, 6000, 12000, 12000]
    path = write_trace(
        tmp_path / "t.jsonl", [{"timestamp": ms, "hash_ids": [i]} for i, ms in enumerate(stamps)]
    )
    spread = read_trace(path).spread()
    assert spread.times_s.tolist() == pytest.approx([0, 1, 2, 3, 6, 9, 12, 13.5])
    assert [spread.request(i) for i in range(8)] == [[i] for i in range(8)]


def test_a_line_that_is_not_a_request_is_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "hash_ids": [1]}\n{"timestamp": 5}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not a request"):
        read_trace(path)
