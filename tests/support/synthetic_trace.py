"""A small request trace in the Mooncake format (bench/trace_file.py), made up for tests: chat
conversations whose every turn sends the whole conversation so far (its leading blocks, shared
with the turns before) plus new blocks, behind a system prompt every request shares."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any


def conversations(
    count: int, turns: int, new_blocks: int, turn_gap_s: float, seed: int = 0
) -> list[dict[str, Any]]:
    """``count`` conversations of ``turns`` turns, ``turn_gap_s`` apart, starting at random
    within the first gap; each turn adds ``new_blocks`` blocks. Requests in time order."""
    rng = random.Random(seed)
    requests = []
    next_block = 1  # block 0: the system prompt
    for _ in range(count):
        start_s = rng.uniform(0, turn_gap_s)
        blocks = [0]
        for turn in range(turns):
            blocks = blocks + list(range(next_block, next_block + new_blocks))
            next_block += new_blocks
            requests.append(
                {
                    "timestamp": round(1000 * (start_s + turn * turn_gap_s)),
                    "input_length": 512 * len(blocks),
                    "output_length": 16,
                    "hash_ids": list(blocks),
                }
            )
    return sorted(requests, key=lambda r: r["timestamp"])


def write_trace(path: Path, requests: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in requests))
    return path
