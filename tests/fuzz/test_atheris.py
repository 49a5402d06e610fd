"""Goal: the coverage-guided fuzzer finds no crash, hang or broken property in the gateway's
parsers of untrusted input.

The fuzzer is tests/support/fuzz_parsers.py run by atheris (libFuzzer) in a subprocess, with the
targets and oracles test_properties.py runs under hypothesis; its inputs are grown by coverage
feedback from the gateway's code. Any uncaught exception (a parser raising something it must
not, or a property's assertion), an input running past libFuzzer's ``-timeout`` or the
subprocess running past its own bound fails the test, with the fuzzer's output and the crashing
input's path.

Short form (default, CI): 3,000 inputs, about 6 s. Long form (``-m slow``): 100,000 inputs,
about six minutes (each input costs more as the corpus grows). ``ADP_FUZZ_RUNS`` overrides the
count of both, ``ADP_FUZZ_SEED`` the seed (default 1: the same inputs on every run). The last
test shows the fuzzer can fail: with a bug planted in decode_keys (fuzz_parsers.plant_keys) it
exits non-zero.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="atheris has Linux wheels only")
ROOT = Path(__file__).resolve().parents[2]
SHORT_RUNS = 3_000
LONG_RUNS = 100_000


def fuzz(
    runs: int, artifacts: Path, timeout_s: float, plant: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LMCACHE_TRACK_USAGE": "false", "DO_NOT_TRACK": "1"}
    env.pop("ADP_FUZZ_PLANT", None)
    if plant is not None:
        env["ADP_FUZZ_PLANT"] = plant
    command = [
        sys.executable,
        "-m",
        "tests.support.fuzz_parsers",
        f"-atheris_runs={runs}",
        f"-seed={os.environ.get('ADP_FUZZ_SEED', '1')}",
        f"-artifact_prefix={artifacts}/",  # a crashing input goes here, not into the repo
    ]
    return subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s
    )


def run_clean(runs: int, artifacts: Path, timeout_s: float) -> None:
    runs = int(os.environ.get("ADP_FUZZ_RUNS", runs))
    result = fuzz(runs, artifacts, timeout_s)
    output = result.stdout[-6000:] + result.stderr[-6000:]
    assert result.returncode == 0, f"the fuzzer failed (exit {result.returncode}):\n{output}"
    assert f"Done {runs} in" in result.stderr, output


def test_fuzzer_short(tmp_path: Path) -> None:
    run_clean(SHORT_RUNS, tmp_path, timeout_s=120)


@pytest.mark.slow
def test_fuzzer_long(tmp_path: Path) -> None:
    run_clean(LONG_RUNS, tmp_path, timeout_s=1800)


def test_fuzzer_fails_on_a_planted_bug(tmp_path: Path) -> None:
    result = fuzz(SHORT_RUNS, tmp_path, timeout_s=120, plant="keys")
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert "Uncaught Python exception" in output, output[-3000:]
    assert "in decode_keys" in output and "ValueError: Unpack failed" in output, output[-3000:]
    assert list(tmp_path.glob("crash-*")), "no crashing input written"
