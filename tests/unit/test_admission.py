"""Goal: admission writes every store while the drive's budget holds and the card keeps objects
long enough, and past that keeps what is likelier to be read again, at the budget's rate.

- The sighting record remembers the keys of late, and forgets a prompt's keys together (a record
  that forgets some blocks of a prompt and not others makes admission write blocks LMCache can
  never reach); a key not seen for longer than the record holds is new again.
- The write budget parses each form it takes and names the field for any other; its bucket
  starts full, refills at the rate, and never lets more through than the rate times the time
  plus one bucket; a store that must leave a reserve passes only above it.
- Admission: off writes everything; on, without budget or pressure, writes everything; a budget
  a quarter of the demand holds the written bytes within 10 % of it and admits keys seen before
  first (new keys only while its bucket stays half full, keys seen before down to empty); under
  pressure (a card that, written every store, would evict objects before most keys come back)
  first sightings are declined and keys seen before admitted, and under heavy pressure keys
  seen once before too, while a card that is not evicting takes everything; a store of a held
  key is only a sighting, and one replacing a held object of another length is always written.
"""

from __future__ import annotations

import math
import time

import pytest

from adp_gateway.card.holdings import NO_HOLDINGS
from adp_gateway.card.software.devices.memory import MemoryDevice
from adp_gateway.card.software.eviction_ages import EvictionAges
from adp_gateway.errors import ConfigError
from adp_gateway.objects.catalog import ObjectCatalog
from adp_gateway.objects.store import ObjectStore
from adp_gateway.policy.admission import Admission, AdmissionSettings
from adp_gateway.policy.budget import WriteBudget, parse_write_budget
from adp_gateway.policy.sightings import ReuseGaps, SightingRecord
from adp_gateway.policy.store_rate import StoreRate
from adp_wire.presence import fingerprint
from tests.support.storage import REGION, extent, open_card, payload


def key(i: int) -> int:
    return fingerprint(f"block-{i}")


def test_the_record_knows_a_key_seen_before_how_often_and_how_long_ago() -> None:
    record = SightingRecord(4096)
    assert record.sight(key(1), 10.0) == (0, math.inf)
    assert record.sight(key(1), 12.5) == (1, 2.5)
    assert record.sight(key(1), 13.0) == (2, 0.5)
    assert record.sight(key(2), 13.0).seen_before == 0


def test_the_record_keeps_the_latest_keys_and_forgets_the_oldest() -> None:
    record = SightingRecord(4096)
    for i in range(20_000):
        record.sight(key(i), float(i))
    latest = [record.sight(key(i), 30_000.0).seen_before for i in range(20_000 - 2048, 20_000)]
    assert all(latest), "the last keys/2 keys are all remembered"
    oldest = [record.sight(key(i), 30_000.0).seen_before for i in range(0, 8192)]
    assert not any(oldest), "keys seen before the last 4096 distinct keys are forgotten"


def test_the_record_forgets_a_prompts_keys_together() -> None:
    """A prompt's 1,000 keys, seen at once, are all still known until they are all forgotten:
    never some of them, however many new keys came since."""
    prompt = [key(10**6 + i) for i in range(1000)]
    known_counts = []
    for waves in range(9):  # up to 8 waves of 1,000 new keys: twice what the record keeps
        record = SightingRecord(4096)
        for fp in prompt:
            record.sight(fp, 0.0)
        for i in range(waves * 1000):
            record.sight(key(i), 1.0 + i / 1000)
        known_counts.append(sum(record.sight(fp, 100.0).seen_before > 0 for fp in prompt))
    assert set(known_counts) <= {0, 1000}, known_counts
    assert known_counts[0] == 1000 and known_counts[-1] == 0


def test_reuse_gaps_give_the_share_that_came_back_within_an_age() -> None:
    gaps = ReuseGaps()
    assert gaps.share_within(100.0) == 0.0
    for gap in [1.0] * 30 + [60.0] * 50 + [3600.0] * 20:
        gaps.add(gap)
    assert gaps.share_within(2.0) == pytest.approx(0.3)
    assert gaps.share_within(130.0) == pytest.approx(0.8)
    assert gaps.share_within(10**6) == pytest.approx(1.0)
    assert gaps.share_within(math.inf) == 1.0
    shares = [gaps.share_within(age) for age in (0.1, 1, 10, 100, 1000, 10**4)]
    assert shares == sorted(shares)


@pytest.mark.parametrize(
    ("value", "rate"),
    [
        ("none", None),
        (None, None),
        ("1dwpd", 1000.0),
        ("0.5 DWPD", 500.0),
        ("200MiB/s", 200.0 * 2**20),
        ("1.5 GB / s", 1.5e9),
        (4096, 4096.0),
    ],
)
def test_write_budget_forms(value: str | int | None, rate: float | None) -> None:
    assert parse_write_budget(value, capacity_bytes=86_400_000) == rate


@pytest.mark.parametrize("value", ["lots", "1dwpd/s", "20MiB", "0/s", "0dwpd", "-3/s"])
def test_a_bad_write_budget_is_named_with_its_forms(value: str) -> None:
    with pytest.raises(ConfigError, match=r"write_budget: .*(1dwpd|none)"):
        parse_write_budget(value, capacity_bytes=10**9)


def test_the_bucket_starts_full_refills_at_its_rate_and_never_overflows() -> None:
    bucket = WriteBudget(rate_bytes_per_s=100.0, depth_bytes=1000.0, now_s=0.0)
    assert bucket.take(1000, 0.0) and not bucket.take(1, 0.0)
    assert not bucket.take(600, 5.0) and bucket.take(500, 5.0)
    assert bucket.level(1000.0) == 1.0
    taken = sum(100 for t in range(2000) if bucket.take(100, 1000.0 + t / 4))
    assert taken <= 100.0 * 500 + 1000  # the rate times the time, plus one bucket


def test_the_bucket_pays_a_store_that_must_leave_a_reserve_only_above_it() -> None:
    bucket = WriteBudget(rate_bytes_per_s=100.0, depth_bytes=1000.0, now_s=0.0)
    assert [bucket.take(200, 0.0, reserve=0.5) for _ in range(3)] == [True, True, False]
    assert bucket.take(600, 0.0) and not bucket.take(1, 0.0)  # no reserve: down to empty
    big = WriteBudget(rate_bytes_per_s=100.0, depth_bytes=1000.0, now_s=0.0)
    assert big.take(1500, 0.0, reserve=0.5)  # larger than the bucket: only when it is full
    assert not big.take(1500, 10.0, reserve=0.5) and big.take(1500, 15.0, reserve=0.5)


def test_the_store_rate_is_a_running_rate_over_its_window() -> None:
    rate = StoreRate(window_s=10.0)
    assert rate.bytes_per_s == 0.0
    for t in range(600):  # 100 bytes every 0.1 s: 1,000 bytes/s
        rate.add(100, t / 10)
    assert rate.bytes_per_s == pytest.approx(1000.0, rel=0.06)
    rate.add(0, 59.9 + 10.0)  # quiet for a window: down to about 1/e
    assert rate.bytes_per_s == pytest.approx(1000.0 / math.e, rel=0.06)


def test_under_a_budget_a_burst_of_keys_seen_before_spends_what_new_keys_leave() -> None:
    """A bucket of 10 stores: new keys take it down to half, and keys seen before to empty."""
    admission = Admission(AdmissionSettings(write_budget_bytes_per_s=100.0, burst_s=100.0), 0.0)
    seen = [key(100 + i) for i in range(8)]
    for fp in seen:
        admission.sighted(fp, 0.0)
    assert stream(admission, [key(i) for i in range(8)], 1.0, 0.0) == [True] * 5 + [False] * 3
    assert stream(admission, seen, 1.0, 0.0) == [True] * 5 + [False] * 3
    statistics = admission.statistics(1.0)
    assert statistics.declined_for_budget == statistics.declined == 6
    assert statistics.bar == 0.0  # no pressure: the budget alone declined


def stream(admission: Admission, keys: list[int], start_s: float, spacing_s: float) -> list[bool]:
    """Store each key, one per ``spacing_s``: what admission decided."""
    return [admission.admit(fp, 1000, start_s + i * spacing_s, None) for i, fp in enumerate(keys)]


def test_admission_off_and_on_without_budget_or_pressure_writes_everything() -> None:
    for enabled in (False, True):
        admission = Admission(AdmissionSettings(enabled=enabled), 0.0)
        assert all(stream(admission, [key(i) for i in range(5000)], 0.0, 0.01))
        assert admission.statistics(100.0).declined == 0


def test_a_budget_of_a_quarter_holds_writes_near_it_and_keeps_keys_seen_before() -> None:
    """Stores of 1,000 bytes at 100 per second for an hour, one in five a key seen before,
    against a budget of 25,000 bytes per second in a bucket of a minute."""
    admission = Admission(
        AdmissionSettings(write_budget_bytes_per_s=25_000.0, burst_s=60.0, record_keys=1 << 16),
        0.0,
    )
    decided: dict[bool, list[bool]] = {True: [], False: []}
    for i in range(360_000):
        repeat = i % 5 == 0 and i >= 40
        fp = key(i - 37 if repeat else i)
        decided[repeat].append(admission.admit(fp, 1000, i / 100, None))
    written = admission.statistics(3600.0).admitted_bytes
    assert abs(written - 25_000 * 3600) <= 0.1 * 25_000 * 3600, written
    assert sum(decided[True]) / len(decided[True]) > 0.9  # seen before: kept
    assert sum(decided[False]) / len(decided[False]) < 0.1  # first sightings: declined


def pressured(
    capacity_bytes: int, bar_max: float = 2.0, thirds: int = 1000
) -> tuple[Admission, list[int]]:
    """An admission for a card of ``capacity_bytes`` (its pressure bar at most ``bar_max``)
    that has seen 2,000 keys come back after 100 to 300 s, and ``thirds`` of them a third time
    50 to 150 s after that, and stores arrive at about 1.8 KB/s; and keys it has seen once."""
    settings = AdmissionSettings(
        record_keys=1 << 16, capacity_bytes=capacity_bytes, pressure_bar_max=bar_max
    )
    admission = Admission(settings, 0)
    seen = [key(i) for i in range(2000)]
    for i, fp in enumerate(seen):
        admission.sighted(fp, 0.0)
        admission.sighted(fp, 100.0 + i / 10)
    for i, fp in enumerate(seen[:thirds]):
        admission.sighted(fp, 150.0 + i / 10 + i % 100)
    for i in range(200):  # the stores' rate of late
        admission.admit(key(20_000 + i), 1000, 400.0 + i * 0.3, None)
    again = [key(10_000 + i) for i in range(1000)]
    for fp in again:
        admission.sighted(fp, 460.0)
    return admission, again


def test_under_pressure_first_sightings_are_declined_and_keys_seen_before_admitted() -> None:
    """A card of 280 KB at about 1.8 KB/s would keep an object about 160 s: long enough for
    under KEEP_NONE of the keys seen once to come back, yet for every key seen twice."""
    admission, again = pressured(capacity_bytes=280_000)
    new = [admission.admit(key(50_000 + i), 1, 470.0, 20.0) for i in range(1000)]
    old = [admission.admit(fp, 1, 470.0, 20.0) for fp in again]
    assert not any(new) and all(old)
    assert admission.statistics(470.0).bar == 1.0


def test_under_heavy_pressure_only_keys_seen_twice_before_are_admitted() -> None:
    """A card of 10 KB would keep an object about 6 s, when no key seen twice comes back in
    less than 50 s: a key seen once before would be evicted unread too. (A bar between 1 and 2
    admits keys seen once before for part of each dither period: not at its start, 470.0.)"""
    admission, again = pressured(capacity_bytes=10_000)
    once = [admission.admit(fp, 1, 470.0, 20.0) for fp in again]
    more = [admission.admit(key(i), 1, 470.0, 20.0) for i in range(500)]  # seen three times
    assert not any(once) and all(more)
    assert admission.statistics(470.0).bar == 2.0


@pytest.mark.parametrize(
    ("capacity_bytes", "low", "high"),
    [(10**9, 0.0, 0.0), (280_000, 1.0, 1.0), (115_000, 1.3, 1.7), (10_000, 2.0, 2.0)],
)
def test_the_pressure_bar_rises_as_the_card_keeps_objects_for_fewer_returns(
    capacity_bytes: int, low: float, high: float
) -> None:
    admission, _ = pressured(capacity_bytes)
    admission.admit(key(99_999), 1, 470.0, 20.0)
    assert low <= admission.statistics(470.0).bar <= high


def test_the_second_step_waits_until_enough_keys_were_seen_a_third_time() -> None:
    admission, _ = pressured(10_000, thirds=10)
    admission.admit(key(99_999), 1, 470.0, 20.0)
    assert admission.statistics(470.0).bar == 1.0


def test_the_pressure_bar_stops_at_its_max() -> None:
    """How the sim holds the gateway's admission at second sighting (``gateway-ss``)."""
    held, _ = pressured(10_000, bar_max=1.0)
    held.admit(key(99_999), 1, 470.0, 20.0)
    assert held.statistics(470.0).bar == 1.0


def test_when_objects_would_last_longer_than_keys_take_to_return_everything_is_written() -> None:
    admission, _ = pressured(capacity_bytes=10**9)
    assert all(admission.admit(key(50_000 + i), 1, 470.0, 20.0) for i in range(1000))


def test_with_no_bytes_stored_yet_objects_would_last_for_ever_and_everything_is_written() -> None:
    """Keys have come back, but nothing was stored yet that cost the drive a byte: at an
    infinite keep no first sighting is declined."""
    admission = Admission(AdmissionSettings(capacity_bytes=10_000), 0.0)
    for i in range(100):
        admission.sighted(key(i), 0.0)
        admission.sighted(key(i), 100.0)
    assert admission.admit(key(99_999), 0, 200.0, 20.0)


def test_a_card_that_does_not_evict_takes_every_store() -> None:
    admission, _ = pressured(capacity_bytes=10_000)
    assert all(admission.admit(key(50_000 + i), 1, 470.0, None) for i in range(1000))


def test_a_store_of_a_held_key_is_a_sighting_not_a_write() -> None:
    admission = Admission(AdmissionSettings(write_budget_bytes_per_s=1.0, burst_s=1.0), 0.0)
    assert admission.admit(key(1), 10**9, 0.0, None, held=True)
    assert admission.statistics(0.0).admitted == 0
    assert admission.admit(key(2), 1, 0.0, None)  # the bucket is still full


def test_eviction_age_follows_the_card_until_it_stops_evicting() -> None:
    ages = EvictionAges()
    assert ages.eviction_age_s(10.0) is None
    for t in range(100):
        ages.evicted(30.0, float(t))
    assert ages.eviction_age_s(99.0 + 20.0) == pytest.approx(30.0)
    assert ages.eviction_age_s(99.0 + 31.0) is None  # no eviction for longer than objects last


def test_a_store_replacing_a_held_object_of_another_length_is_always_written() -> None:
    """Declined, it would leave the replaced version to be found (a cache may drop a store,
    never serve what an acknowledged store replaced); a store of a new key is declined."""
    catalog = ObjectCatalog(NO_HOLDINGS)
    card = open_card([MemoryDevice(4096 + 8 * REGION)], holdings=catalog)
    no_room = AdmissionSettings(write_budget_bytes_per_s=1.0, burst_s=1.0)
    store = ObjectStore(card, catalog, Admission(no_room, time.monotonic()))
    store.recover()
    store.put("t", "held", extent(payload(1, 4096)), 4096)
    assert store.admit("t", "first", 8192)  # the full bucket pays; it owes the rest
    assert not store.admit("t", "new", 8192)
    assert store.admit("t", "held", 8192)
    assert store.admit("t", "held", 4096)  # held as it is: nothing to write
