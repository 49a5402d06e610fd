"""Fixtures of the end-to-end suite: a tiny model built offline, and every process a test starts
stopped at its end, pass or fail, with a check that nothing it started is left behind
(``owned_stack``: only what its own processes made, never another process's files)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import (
    remove_tree,
    short_tmpdir,
)
from tests.support.e2e_stack import E2E_BIN, ENV, HERE, Stack, Vllm, owned_stack

SEEDS = (1, 2, 3, 4)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if not (E2E_BIN / "python").exists():
        skip = pytest.mark.skip(
            reason="no .venv-e2e: scripts/test.sh sets it up (scripts/setup-e2e.sh)"
        )
        for item in items:
            if "e2e" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def model_dir() -> Iterator[Path]:
    directory = short_tmpdir()
    subprocess.run(
        [str(E2E_BIN / "python"), str(HERE / "make_model.py"), str(directory / "m")],
        check=True,
        env=ENV,
        timeout=300,
    )
    yield directory / "m"
    remove_tree(directory)


@pytest.fixture
def stack(model_dir: Path) -> Iterator[Stack]:
    workdir = short_tmpdir()
    try:
        with owned_stack(workdir, model_dir) as stack:
            yield stack
    finally:
        remove_tree(workdir)


@pytest.fixture(scope="session")
def cold_outputs(model_dir: Path) -> dict[int, list[int]]:
    """Greedy output token ids of each seed's prompt with no KV connector at all."""
    workdir = short_tmpdir()
    engine = Vllm(workdir, "cold")
    try:
        engine.start(model_dir, None)
        return {seed: engine.request(seed)["output_token_ids"] for seed in SEEDS}
    finally:
        engine.stop()
        remove_tree(workdir)
