"""Goal: the first set-up (scripts/setup-env.sh, which serve.sh, smoke.sh and test.sh source)
says what it does in its own lines and nothing else: no "Failed to initialize NumPy" from torch
imported before numpy is there, no LMCache log lines from the import check. A cold set-up
installs torch and LMCache into a new venv (minutes): slow."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import ROOT, remove_tree, short_tmpdir

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def venv() -> Iterator[Path]:
    directory = short_tmpdir()
    yield directory / "venv"
    remove_tree(directory)


def test_a_cold_set_up_prints_its_own_lines_only(venv: Path) -> None:
    env = {**os.environ, "ADP_VENV": str(venv), "ADP_EXTRAS": "serve"}
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup-env.sh")],
        capture_output=True,
        text=True,
        timeout=1500,
        env=env,
        check=False,
    )
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-4000:]
    assert "Failed to initialize NumPy" not in said, said[-4000:]
    assert [line for line in said.splitlines() if not line.startswith("setup-env: ")] == []
    assert "installing lmcache-adp[serve]" in said
    imported = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import lmcache_adp, numpy, torch"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert imported.returncode == 0, imported.stderr[-3000:]
