"""Goal: damage costs only what it touched. Trials flip one random byte in one on-disk structure
of every kind (superblock, region start record, record header, payload, footer, trailer) of
databases the real object store wrote, closed cleanly or as a kill leaves them, and judge
each: no load returns a wrong byte, an object is lost only when the flip hit its own bytes, a
deleted object comes back only when the flip hit a tombstone (and then with one of its own
past versions), and `adp-gateway check` reports damage in every trial.

CI runs a short form (60 trials, ten of each kind); `-m slow` runs 1,000
(``ADP_CORRUPTION_TRIALS`` sets another count, ``ADP_CORRUPTION_SEED`` the seed).
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from adp_gateway.card.software.check import check
from adp_gateway.objects.census import ObjectCensus
from tests.support.corruption import KINDS, REGION, Image, Tally, trial, write_image

SHORT_TRIALS = 60
LONG_TRIALS = int(os.environ.get("ADP_CORRUPTION_TRIALS", "1000"))


def images(directory: Path, seed: int) -> list[Image]:
    """A cleanly closed image and a killed one, each checked clean before any flip."""
    made = [
        write_image(directory / "sealed", seed, crash=False),
        write_image(directory / "killed", seed + 1, crash=True),
    ]
    for image in made:
        paths = [str(p) for p in image.paths()]
        report = check(paths, False, lambda *progress: None, REGION, ObjectCensus())
        assert not report.damage, report.damage
        pristine = trial(image, directory / "trial", random.Random(0), None)
        assert pristine.wrong == 0 and not pristine.lost and not pristine.back, pristine
        assert all(image.spans[kind] for kind in KINDS), {k: len(v) for k, v in image.spans.items()}
    return made


def run(directory: Path, trials: int, seed: int) -> Tally:
    rng = random.Random(seed)
    made = images(directory, seed)
    tally = Tally()
    for number in range(trials):
        kind = KINDS[number % len(KINDS)]
        image = made[(number // len(KINDS)) % len(made)]
        outcome = trial(image, directory / "trial", rng, kind)
        where = f"trial {number} (seed {seed}) of {image.directory.name}, {kind}: {outcome}"
        assert outcome.wrong == 0, where
        assert outcome.lost <= outcome.owners, where
        assert not outcome.back or outcome.tombstone, where
        assert outcome.reported, where
        tally.add(outcome)
    print(f"\ncorruption suite, seed {seed}: {tally.line()}")
    return tally


def test_flipped_bytes_cost_only_what_they_hit(tmp_path: Path) -> None:
    tally = run(tmp_path, SHORT_TRIALS, int(os.environ.get("ADP_CORRUPTION_SEED", "41")))
    assert tally.reported == SHORT_TRIALS


@pytest.mark.slow
def test_flipped_bytes_cost_only_what_they_hit_long(tmp_path: Path) -> None:
    seed = int(os.environ.get("ADP_CORRUPTION_SEED", str(random.randrange(2**31))))
    tally = run(tmp_path, LONG_TRIALS, seed)
    assert tally.reported == LONG_TRIALS
