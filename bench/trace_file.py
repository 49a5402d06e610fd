"""A request trace in the Mooncake format: one JSON object per line, ``timestamp`` (ms from the
start), ``input_length``, ``output_length`` and ``hash_ids`` (the prompt's blocks as ids: two
requests that share a prefix share its leading ids).

A request's last block is usually partial (``input_length`` is seldom a multiple of the block's
512 tokens). LMCache keys and stores whole chunks only (its ``TokenHasher`` discards a partial
one), so a trace is read as LMCache would see it: each request's whole blocks, and a request
shorter than one block not at all. On Mooncake's conversation trace that drops 4 % of the block
references and 6.5 % of the distinct blocks, almost none of which is ever referenced again
(each is the tail of one prompt, which the next turn extends into a different block).

The project measures on Mooncake's conversation trace (Moonshot AI's Kimi service, published
with the Mooncake FAST'25 paper, kvcache-ai/Mooncake, Apache License 2.0); its path is always
given on the command line, never assumed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

BLOCK_TOKENS = 512  # the Mooncake format's tokens per block

# What a report says of a trace it knows: where it comes from (its licence asks for this).
SOURCES = {
    "mooncake_conversation_trace.jsonl": "one hour of Moonshot AI's Kimi conversation service, "
    "published with the Mooncake FAST'25 paper: kvcache-ai/Mooncake, "
    "FAST25-release/traces/conversation_trace.jsonl, Apache License 2.0",
}


def source_of(name: str) -> str:
    """`` (where it comes from)`` for a trace of SOURCES, else nothing."""
    return f" ({SOURCES[name]})" if name in SOURCES else ""


@dataclass(frozen=True)
class Trace:
    """Requests in time order: request ``i``'s blocks are ``blocks[starts[i]:starts[i + 1]]``,
    sent at ``times_s[i]``."""

    times_s: npt.NDArray[np.float64]
    starts: npt.NDArray[np.int64]
    blocks: npt.NDArray[np.int64]

    @property
    def requests(self) -> int:
        return len(self.times_s)

    @property
    def references(self) -> int:
        return len(self.blocks)

    @property
    def distinct(self) -> int:
        return len(np.unique(self.blocks))

    @property
    def duration_s(self) -> float:
        return float(self.times_s[-1] - self.times_s[0]) if self.requests else 0.0

    def capacity_blocks(self, percent: float) -> int:
        """``percent`` % of the distinct blocks, at least one: a capacity the benches compare
        policies at."""
        return max(1, int(self.distinct * percent / 100))

    def request(self, i: int) -> list[int]:
        return self.blocks[self.starts[i] : self.starts[i + 1]].tolist()  # type: ignore[no-any-return]

    def infinite_hit_ratio(self) -> float:
        """What a cache that never evicts hits: every reference but each block's first."""
        return (self.references - self.distinct) / max(self.references, 1)

    def head(self, requests: int) -> Trace:
        """The first ``requests`` requests."""
        end = int(self.starts[requests])
        return Trace(self.times_s[:requests], self.starts[: requests + 1], self.blocks[:end])

    def spread(self) -> Trace:
        """The same requests, those that share a timestamp spread evenly over the time to the next
        one (the last ones over the median step). Mooncake's timestamps come in steps of about
        3 s: sent at once, a step's requests would be a burst the service never saw, and the
        gateway's admission, which dithers by the time (admission.py), would decide them as
        one."""
        if self.requests < 2:
            return self
        distinct, first, counts = np.unique(self.times_s, return_index=True, return_counts=True)
        steps = np.diff(distinct)
        step = np.append(steps, np.median(steps) if len(steps) else 0.0)
        place = np.arange(self.requests) - np.repeat(first, counts)
        times_s = self.times_s + np.repeat(step / counts, counts) * place
        return Trace(times_s, self.starts, self.blocks)

    def scaled(self, time_factor: float) -> Trace:
        """The same requests ``time_factor`` times faster (a factor of 4: an hour in 15 min)."""
        assert time_factor > 0
        start = self.times_s[0] if self.requests else 0.0
        return Trace((self.times_s - start) / time_factor, self.starts, self.blocks)


def read_trace(path: Path) -> Trace:
    """Each request's whole blocks (all its blocks where a line gives no ``input_length``).
    Raises ValueError naming the line that is not a request of this format."""
    times, lengths, blocks = [], [], []
    with open(path) as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                request = json.loads(line)
                ids = [int(h) for h in request["hash_ids"]]
                if "input_length" in request:
                    ids = ids[: int(request["input_length"]) // BLOCK_TOKENS]
                time_s = float(request["timestamp"]) / 1000
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(
                    f"{path}:{number}: not a request of the Mooncake trace format ({exc!r}): "
                    "each line needs a timestamp (ms) and hash_ids"
                ) from exc
            if ids:
                times.append(time_s)
                lengths.append(len(ids))
                blocks += ids
    order = np.argsort(np.array(times), kind="stable")
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    sorted_blocks = [blocks[starts[i] : starts[i + 1]] for i in order]
    sorted_lengths = [lengths[i] for i in order]
    return Trace(
        np.array(times, np.float64)[order],
        np.concatenate([[0], np.cumsum(sorted_lengths)]).astype(np.int64),
        np.array([b for request in sorted_blocks for b in request], np.int64),
    )
