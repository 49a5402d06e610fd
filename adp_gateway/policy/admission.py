"""Admission: which stores the gateway writes to the drive.

A persistent tier is worth what it hits per byte it writes. By default every store is written
while the drive's write budget holds (budget.py: a bucket of a day's worth of the budget), so a
prompt seen once is on the drive after a restart. Admission declines a store only when one of two
things says it would cost a write for little:

- the budget: a store is written only while the bucket holds its bytes, and a store of a key
  never seen before only while the bucket stays at least half full after it
  (``FIRST_SIGHTING_RESERVE``). So the other half is kept for keys seen before, about five
  times likelier to be read again per byte written on the production trace, and a burst of
  them spends it where a burst of new keys cannot; under light load the bucket stays full and
  every store is written;
- the card's pressure: when the card is full and evicting (its ``eviction_age_s``: for the
  software card, adp_gateway/card/software/eviction_ages.py), and objects would last there less
  long than most keys take to come back (``ReuseGaps``) were every store written, an object seen
  for the first time would mostly be evicted unread, and such stores are declined in the
  measure of it. Keys seen once before are judged the same way on the gaps after which such
  keys came back a third time, and declined in the measure that objects would last less long
  than KEEP_FEW of those. How long objects would last is the card's capacity over the stores'
  recent rate, not the eviction age the card reports: that age grows as admission declines,
  and judged on it admission would settle halfway, whatever the traffic.

Both rank a store by how often its key was seen before (the ``SightingRecord``: loads that hit,
and stores, count). Pressure sets a bar: a store is written when ``seen_before + 1 - d``
exceeds it. A bar of 0 writes everything; 1 writes only keys seen before ("second sighting");
0.5 also keys never seen before, half of the time. ``d`` goes from 0 to 1 over every
``DITHER_PERIOD_S``, so what a fractional bar admits is the stores of part of each period: a
prompt's stores, which arrive together, are admitted or declined together. (A share of keys
chosen by hash would admit some of a prompt's new blocks and not others, and LMCache reads a
prompt's blocks only up to the first it misses: on the production trace that cost a third of
the hits.) Along a prompt, keys are seen no less often than those after them, so a bar on how
often splits a prompt only where what follows is worth less anyway. A store of a key the store
holds already only counts as a sighting.

A declined store is reported to LMCache as done: for a cache that is a store followed at once
by an eviction. The gateway counts both kinds (``statistics``).

On the project's production trace, pressure admission with the scan-resistant eviction of
adp_gateway/card/software/victims.py hits more than LRU or second sighting alone where the
capacity is short (1 to 5 % of the trace's distinct blocks: up to twice LRU's hits with a twelfth
of its writes), a little more than LRU at 10 and 25 %, and 0.1 % of the references less at 50 %
(bench/results/trace-sim-vm.md); ``bench/trace_sim.py`` runs this very class.

Thread-safe: the session threads (stores) and the I/O threads (load hits) call it.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from adp_gateway.policy.budget import SECONDS_PER_DAY, WriteBudget, parse_write_budget
from adp_gateway.policy.sightings import ReuseGaps, SightingRecord
from adp_gateway.policy.store_rate import StoreRate

if TYPE_CHECKING:
    from adp_gateway.config import GatewayConfig

# The share of the budget's bucket a store of a key never seen before must leave in it. Weighed
# on the production trace at a quarter of the write-everything rate (bench/results/
# trace-sim-vm.md; 0.25 and 0.75 in scratch runs): each hit more than second sighting at every
# capacity, where a bar that held the bucket near a quarter full by rank (the rule before) hit
# up to 0.7 points of the references less at 25 and 50 %.
FIRST_SIGHTING_RESERVE = 0.5
STORE_RATE_WINDOW_S = 60.0  # how far back the stores' rate looks
# Under pressure: first sightings are all written while the card keeps objects long enough for
# KEEP_ALL of keys seen once to come back, none below KEEP_NONE, a share in between; second
# sightings all while it keeps them long enough for KEEP_FEW of keys seen twice to come back,
# and a share that falls to none with what it keeps below. On the production trace the second
# step cut the writes at 1 % of its distinct blocks by a half and hit 0.2 points of the
# references more (bench/results/trace-sim-vm.md); it never engages from 5 % up.
KEEP_ALL = 0.65
KEEP_NONE = 0.55
KEEP_FEW = 0.3
PRESSURE_STEPS = ((KEEP_ALL, KEEP_NONE), (KEEP_FEW, 0.0))  # each ramp: where it starts, ends
GAPS_KNOWN_MIN = 64.0  # fewer gaps than this say too little: no pressure bar
DITHER_PERIOD_S = 1.0


@dataclass(frozen=True)
class AdmissionSettings:
    enabled: bool = True  # False: write every store (no record, no budget)
    write_budget_bytes_per_s: float | None = None  # None: no budget
    burst_s: float = SECONDS_PER_DAY  # the bucket holds this many seconds of the budget
    record_keys: int = 1 << 20  # the distinct keys the sighting record keeps
    bar_floor: float = 0.0  # the lowest bar
    # The highest bar the card's pressure sets; 1, with a bar_floor of 1: second sighting (for
    # weighing it).
    pressure_bar_max: float = 2.0
    capacity_bytes: int | None = None  # the card's; None: no pressure admission


def settings_for(config: GatewayConfig) -> AdmissionSettings:
    """The config's admission (its capacity resolved): the budget's rate, and a record of
    eight keys per fragment the card can hold (an object is a fragment or more)."""
    assert config.capacity is not None
    return AdmissionSettings(
        enabled=config.admission,
        write_budget_bytes_per_s=parse_write_budget(config.write_budget, config.capacity),
        burst_s=config.write_budget_burst_s,
        record_keys=8 * config.capacity // config.fragment_size,
        capacity_bytes=config.capacity,
    )


@dataclass(frozen=True)
class AdmissionStatistics:
    enabled: bool
    admitted: int
    declined: int
    admitted_bytes: int
    declined_bytes: int
    declined_for_budget: int  # declined to keep within the write budget (the rest: pressure)
    bar: float  # the last store's bar: pressure's, or the floor (0: none)
    write_budget_bytes_per_s: float | None
    budget_level: float | None  # 0 (empty) to 1 (full); None without a budget
    eviction_age_s: float | None


class Admission:
    def __init__(self, settings: AdmissionSettings, now_s: float) -> None:
        self.settings = settings
        self._record = SightingRecord(settings.record_keys)
        # The gaps after which keys seen once, and keys seen twice, were seen again.
        self._gaps = (ReuseGaps(), ReuseGaps())
        self._budget: WriteBudget | None = None
        rate = settings.write_budget_bytes_per_s
        if settings.enabled and rate is not None:
            self._budget = WriteBudget(rate, rate * settings.burst_s, now_s)
        self._store_rate = StoreRate(STORE_RATE_WINDOW_S)
        self._lock = threading.Lock()
        self._admitted = self._declined = self._for_budget = 0
        self._admitted_bytes = self._declined_bytes = 0
        self._bar = 0.0
        self._eviction_age_s: float | None = None

    def admit(
        self,
        fingerprint: int,
        nbytes: int,
        now_s: float,
        eviction_age_s: float | None,
        held: bool = False,
        drive_bytes: int | None = None,
    ) -> bool:
        """Whether to write this store of ``nbytes``. ``eviction_age_s``: how long objects
        lately lasted on the card before eviction (the card's ``eviction_age_s``), None while it
        is not evicting;
        ``held``: the store holds the key already (nothing will be written); ``drive_bytes``:
        what writing it costs the drive (the card's ``write_cost``; default ``nbytes``), which
        the budget and the stores' rate count in."""
        if not self.settings.enabled:
            return self._count(True, nbytes)
        with self._lock:
            seen_before = self._sight(fingerprint, now_s)
            if held:
                return True
            self._eviction_age_s = eviction_age_s
            cost = nbytes if drive_bytes is None else drive_bytes
            self._store_rate.add(cost, now_s)
            pressure_bar = min(self._pressure_bar(eviction_age_s), self.settings.pressure_bar_max)
            self._bar = max(self.settings.bar_floor, pressure_bar)
            if seen_before + 1 - _dither(now_s) <= self._bar:
                return self._count_locked(False, nbytes)
            reserve = FIRST_SIGHTING_RESERVE if seen_before == 0 else 0.0
            if self._budget is not None and not self._budget.take(cost, now_s, reserve):
                self._for_budget += 1
                return self._count_locked(False, nbytes)
            return self._count_locked(True, nbytes)

    def sighted(self, fingerprint: int, now_s: float) -> None:
        """The key was read (a load hit): one more sighting."""
        if not self.settings.enabled:
            return
        with self._lock:
            self._sight(fingerprint, now_s)

    def statistics(self, now_s: float) -> AdmissionStatistics:
        with self._lock:
            budget = self._budget
            return AdmissionStatistics(
                enabled=self.settings.enabled,
                admitted=self._admitted,
                declined=self._declined,
                admitted_bytes=self._admitted_bytes,
                declined_bytes=self._declined_bytes,
                declined_for_budget=self._for_budget,
                bar=self._bar,
                write_budget_bytes_per_s=budget.rate_bytes_per_s if budget else None,
                budget_level=budget.level(now_s) if budget else None,
                eviction_age_s=self._eviction_age_s,
            )

    def _sight(self, fingerprint: int, now_s: float) -> int:
        """Record a sighting (under the lock); how often the key was seen before."""
        seen_before, gap_s = self._record.sight(fingerprint, now_s)
        if 1 <= seen_before <= len(self._gaps):
            self._gaps[seen_before - 1].add(gap_s)
        return seen_before

    def _pressure_bar(self, eviction_age_s: float | None) -> float:
        """0 while the card is not evicting, or would keep objects, every store written, long
        enough for KEEP_ALL of keys seen once to come back; 1 (second sighting) below KEEP_NONE,
        while it keeps them long enough for KEEP_FEW of keys seen twice to come back; 2 (third
        sighting) were it to keep them for none; in between else. Each step waits for
        GAPS_KNOWN_MIN gaps of its keys."""
        capacity = self.settings.capacity_bytes
        if eviction_age_s is None or capacity is None:
            return 0.0
        rate = self._store_rate.bytes_per_s
        keep_s = capacity / rate if rate else math.inf
        bar = 0.0
        for gaps, (start, end) in zip(self._gaps, PRESSURE_STEPS, strict=True):
            if gaps.known < GAPS_KNOWN_MIN:
                break
            bar += _ramp(start, end, gaps.share_within(keep_s))
        return bar

    def _count(self, admitted: bool, nbytes: int) -> bool:
        with self._lock:
            return self._count_locked(admitted, nbytes)

    def _count_locked(self, admitted: bool, nbytes: int) -> bool:
        if admitted:
            self._admitted += 1
            self._admitted_bytes += nbytes
        else:
            self._declined += 1
            self._declined_bytes += nbytes
        return admitted


def _ramp(start: float, end: float, kept: float) -> float:
    """0 where ``kept`` is ``start`` or more, 1 where it is ``end`` or less, linear between."""
    return min(1.0, max(0.0, (start - kept) / (start - end)))


def _dither(now_s: float) -> float:
    """Where in its period ``now_s`` lies, from 0 to 1."""
    return (now_s / DITHER_PERIOD_S) % 1.0
