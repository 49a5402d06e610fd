"""A compact, bounded record of the keys seen lately: how often each was seen and when last.

Admission asks it on every store (and hears every load hit): a key seen before is likelier to be
read again than one seen for the first time (on the project's production trace, 42 % of blocks
seen once came back, 74 % of those seen three times; bench/results/trace-replay-*.md).

It keeps the last ``keys`` to ``keys / 2`` distinct keys seen, in generations: a generation ends
after ``keys / 2`` new keys, and a key not seen again in the generation it was last seen in or
the next one is forgotten. So the keys of one prompt, seen together, are forgotten together: a
record that forgot some of a prompt's blocks and not others (as one that evicts by hash bucket
does) would have admission write a prompt's later blocks without its earlier ones, which
LMCache can never reach (it loads a prefix); on the production trace that cost second sighting
a tenth of its hits.

The entries are 64-bit key fingerprints in numpy arrays, in sets of ``WAYS`` (a key's set is
its fingerprint's low bits), four times as many as the keys kept, 21 bytes each whatever the
keys' length, so that a set overflows (and loses its least recently seen key, one of a prompt's
only) about once in a million sets. Counts saturate at
``COUNT_MAX``. A fingerprint collision only makes a key look seen before: a store admitted that
might not have been.

Beside it, ``ReuseGaps`` keeps how long keys took to come back (a histogram of gaps, decayed so
that it follows the traffic); admission keeps one for the gaps between a key's first and second
sighting and one for those between its second and third, which tell it how long the cache must
keep an object seen once, or twice, for it to be read again.

Not thread-safe: admission holds its own lock around both.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

WAYS = 16
COUNT_MAX = 255
KEYS_MIN = 1 << 10
KEYS_MAX = 1 << 21  # 176 MiB; a gateway sizes it from its capacity (admission.py)
SLOTS_PER_KEY = 4


class Sighting(NamedTuple):
    seen_before: int  # how many times the key was seen before this sighting (0: never)
    gap_s: float  # seconds since the key was last seen; inf when never


class SightingRecord:
    def __init__(self, keys: int) -> None:
        """Keeps about the last ``keys`` distinct keys (rounded up to a power of two within
        [KEYS_MIN, KEYS_MAX])."""
        keys = min(KEYS_MAX, max(KEYS_MIN, 1 << max(0, keys - 1).bit_length()))
        self.keys = keys
        self.sets = SLOTS_PER_KEY * keys // WAYS
        self._fingerprints = np.zeros((self.sets, WAYS), np.uint64)
        self._seen_s = np.zeros((self.sets, WAYS), np.float64)
        self._counts = np.zeros((self.sets, WAYS), np.uint8)
        self._generations = np.zeros((self.sets, WAYS), np.uint32)  # 0: never used
        self._generation = 2  # entries of this generation and the one before are live
        self._new_keys = 0  # in this generation

    def sight(self, fingerprint: int, now_s: float) -> Sighting:
        """Record one sighting of the key; what the record knew of it before."""
        fingerprint = fingerprint or 1
        row = fingerprint % self.sets
        live = self._generations[row] + 1 >= self._generation
        found = np.flatnonzero((self._fingerprints[row] == np.uint64(fingerprint)) & live)
        if found.size:
            way = int(found[0])
            before = Sighting(int(self._counts[row, way]), now_s - float(self._seen_s[row, way]))
            self._counts[row, way] = min(COUNT_MAX, before.seen_before + 1)
        else:
            free = np.flatnonzero(~live)
            way = int(free[0]) if free.size else int(np.argmin(self._seen_s[row]))
            before = Sighting(0, math.inf)
            self._fingerprints[row, way] = fingerprint
            self._counts[row, way] = 1
            self._new_keys += 1
            if self._new_keys >= self.keys // 2:
                self._generation += 1
                self._new_keys = 0
        self._seen_s[row, way] = now_s
        self._generations[row, way] = self._generation
        return before


class ReuseGaps:
    """The gaps after which keys were seen again, in buckets doubling from ``FIRST_S``;
    every ``DECAY_EVERY`` gaps all counts halve, so it follows the traffic of late."""

    FIRST_S = 0.25
    BUCKETS = 24  # up to 0.25 * 2**23 s, 24 days
    DECAY_EVERY = 4096

    def __init__(self) -> None:
        self._counts = np.zeros(self.BUCKETS, np.float64)
        self._added = 0

    @property
    def known(self) -> float:
        """How many gaps (decayed) the estimate rests on."""
        return float(self._counts.sum())

    def add(self, gap_s: float) -> None:
        self._counts[self._bucket(gap_s)] += 1
        self._added += 1
        if self._added % self.DECAY_EVERY == 0:
            self._counts *= 0.5

    def share_within(self, age_s: float) -> float:
        """The share of gaps no longer than ``age_s`` (0 with no gap known yet)."""
        total = self._counts.sum()
        if total == 0:
            return 0.0
        bucket = self._bucket(age_s)
        # The bucket that holds age_s counts in proportion to where in it age_s lies.
        low = 0.0 if bucket == 0 else self.FIRST_S * 2 ** (bucket - 1)
        high = self.FIRST_S * 2**bucket
        inside = min(1.0, max(0.0, (age_s - low) / (high - low)))
        return float((self._counts[:bucket].sum() + inside * self._counts[bucket]) / total)

    def _bucket(self, gap_s: float) -> int:
        if gap_s <= self.FIRST_S:
            return 0
        if gap_s >= self.FIRST_S * 2 ** (self.BUCKETS - 1):  # the last bucket, infinity included
            return self.BUCKETS - 1
        return math.ceil(math.log2(gap_s / self.FIRST_S))
