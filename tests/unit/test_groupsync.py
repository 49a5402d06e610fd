"""Goal: group commit makes every caller's completed writes durable, sharing fdatasyncs; the
periodic clock commits each of the card's syncs on its interval, and one whose device does not
answer holds back only its own."""

from __future__ import annotations

import threading
import time

import pytest

from adp_gateway.card.software.devices import groupsync
from adp_gateway.card.software.devices.groupsync import GroupSync
from adp_gateway.card.software.devices.memory import MemoryDevice
from adp_gateway.scheduling.periodic_sync import PeriodicSync
from tests.support import wait_until


class SlowDevice(MemoryDevice):
    """Records, at each sync's start, how many writes had completed."""

    def __init__(self, gate: list[GroupSync]) -> None:
        super().__init__(4096)
        self.gate = gate
        self.covered: list[int] = []

    def sync(self) -> None:
        self.covered.append(self.gate[0]._completed_writes)
        time.sleep(0.02)
        super().sync()


def test_every_caller_is_covered_by_a_sync_that_started_after_its_write() -> None:
    holder: list[GroupSync] = []
    device = SlowDevice(holder)
    gate = GroupSync(device)
    holder.append(gate)
    done: list[tuple[int, int]] = []  # (writes completed before the caller's sync, syncs after)

    def writer() -> None:
        for _ in range(5):
            gate.wrote()
            with gate._cond:
                mine = gate._completed_writes
            gate.sync()
            done.append((mine, gate._synced_writes))

    threads = [threading.Thread(target=writer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(done) == 40
    assert all(synced >= mine for mine, synced in done)
    assert device.syncs < 40  # shared: far fewer fdatasyncs than callers
    assert max(device.covered) == 40


def test_a_failed_sync_raises_and_the_next_caller_retries() -> None:
    class Failing(MemoryDevice):
        fail = True

        def sync(self) -> None:
            if self.fail:
                self.fail = False
                raise OSError(5, "EIO")
            super().sync()

    device = Failing(4096)
    gate = GroupSync(device)
    gate.wrote()
    try:
        gate.sync()
        raise AssertionError("the EIO was swallowed")
    except OSError:
        pass
    gate.sync()
    assert device.syncs == 1


def test_periodic_sync_commits_on_its_clock_and_stops() -> None:
    ticks: list[float] = []
    periodic = PeriodicSync([lambda: ticks.append(time.monotonic())], 0.02)
    started = time.monotonic()
    periodic.start()
    wait_until(lambda: len(ticks) >= 5, 10, "five commits")
    periodic.stop()
    # A commit every interval, never sooner: five took at least four intervals.
    assert ticks[4] - ticks[0] >= 4 * 0.02 and ticks[0] - started >= 0.02
    count = len(ticks)
    periodic.stop()  # stopping twice is harmless; stopped means no more commits
    assert len(ticks) == count and periodic.stop(0) == []


def test_a_failing_periodic_sync_keeps_its_clock() -> None:
    calls: list[int] = []

    def failing() -> None:
        calls.append(1)
        raise OSError(5, "EIO")

    periodic = PeriodicSync([failing], 0.01)
    periodic.start()
    wait_until(lambda: len(calls) >= 3, 10, "commits to go on after a failure")
    periodic.stop()


class StuckSyncDevice(MemoryDevice):
    """A device whose fdatasync does not return until released (a disk that stopped
    answering)."""

    def __init__(self) -> None:
        super().__init__(4096)
        self.release = threading.Event()
        self.entered = threading.Event()

    def sync(self) -> None:
        self.entered.set()
        self.release.wait(30)
        super().sync()


def test_a_caller_waiting_for_a_stuck_sync_gives_up_at_its_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sync waits for the one in progress, which waited for ever while the disk did not
    answer; now it fails (TimeoutError, an OSError the card turns into a failed op) once
    SYNC_WAIT_S has passed."""
    monkeypatch.setattr(groupsync, "SYNC_WAIT_S", 0.3, raising=False)
    device = StuckSyncDevice()
    gate = GroupSync(device)
    gate.wrote()
    first = threading.Thread(target=gate.sync)
    first.start()
    assert device.entered.wait(10)
    gate.wrote()
    started = time.monotonic()
    try:
        with pytest.raises(TimeoutError, match=r"has not returned in 0\.3 s"):
            gate.sync()
        assert time.monotonic() - started < 5
    finally:
        device.release.set()
        first.join(10)


def test_a_periodic_sync_that_does_not_return_holds_back_only_its_own_clock() -> None:
    """The software card gives one sync per database: a database whose fdatasync hangs must not
    leave the others' writes undurable. Stopping reports the stuck one."""
    stuck, release, ticks = threading.Event(), threading.Event(), []

    def hangs() -> None:
        stuck.set()
        release.wait(30)

    periodic = PeriodicSync([hangs, lambda: ticks.append(1)], 0.01)
    periodic.start()
    try:
        assert stuck.wait(10)
        seen = len(ticks)
        wait_until(lambda: len(ticks) >= seen + 5, 10, "the other database's commits to go on")
        assert periodic.stop(0.2) == ["sync-0"]
    finally:
        release.set()
    assert periodic.stop(10) == []
