"""Goal: the gateway's autogroup goes back to the priority it started with as soon as a load is
queued, stays there while loads run or wait and for a short linger after, then goes back down;
a change the kernel refuses is retried, never lost. (The real process's priority, the kernel's
autogroup included, is checked in test_gateway_process.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from adp_gateway.host import priority


@pytest.fixture
def autogroup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A file in place of /proc/self/autogroup: what Boost last wrote."""
    path = tmp_path / "autogroup"
    path.write_text("19\n")
    monkeypatch.setattr(priority, "AUTOGROUP", path)
    return path


def nice(autogroup: Path) -> int:
    return int(autogroup.read_text())


def test_a_load_raises_the_priority_at_once_and_it_lowers_after_the_linger(
    autogroup: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    boost = priority.Boost(started=0, lowered=19)
    boost.settle(lambda: False)
    assert nice(autogroup) == 19
    boost.load_arrived()
    assert nice(autogroup) == 0
    boost.settle(lambda: False)  # within the linger: a restore's next batch is on its way
    assert nice(autogroup) == 0
    monkeypatch.setattr(priority, "LINGER_S", 0.0)
    boost.settle(lambda: True)  # a load still runs or waits
    assert nice(autogroup) == 0
    boost.settle(lambda: False)
    assert nice(autogroup) == 19


def test_a_refused_change_is_retried_by_the_next_settle(
    autogroup: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    boost = priority.Boost(started=0, lowered=19)
    autogroup.unlink()
    autogroup.mkdir()  # writing it fails with an OSError, as the kernel's EAGAIN does
    boost.load_arrived()
    autogroup.rmdir()
    autogroup.write_text("19\n")
    boost.settle(lambda: True)
    assert nice(autogroup) == 0
    monkeypatch.setattr(priority, "LINGER_S", 0.0)
    autogroup.unlink()
    autogroup.mkdir()
    boost.settle(lambda: False)  # refused: it still counts as raised
    autogroup.rmdir()
    autogroup.write_text("0\n")
    boost.settle(lambda: False)
    assert nice(autogroup) == 19
