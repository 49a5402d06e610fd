"""Hypothesis settings for the fuzz suite (tests/fuzz/test_properties.py).

``ci`` (the default): 200 cases per property, derandomized (the same cases on every run), no
example database, no per-case deadline (test_properties.py bounds each case itself).
``long``: 10,000 cases per property, randomized, failures printed with their reproduction blob;
the ``slow`` tests use it, and ``HYPOTHESIS_PROFILE=long`` makes it the default.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis.configuration import set_hypothesis_home_dir

# Hypothesis keeps caches (constants it mines from the code, Unicode tables) in ./.hypothesis
# even without an example database: keep them out of the checkout, one directory per checkout.
_root = str(Path(__file__).resolve().parents[2])
_cache = (
    Path(tempfile.gettempdir()) / f"adp-hypothesis-{hashlib.sha1(_root.encode()).hexdigest()[:8]}"
)
set_hypothesis_home_dir(os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY", _cache))

settings.register_profile(
    "ci",
    max_examples=200,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "long", settings.get_profile("ci"), max_examples=10_000, derandomize=False, print_blob=True
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
