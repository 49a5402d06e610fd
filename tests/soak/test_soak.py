"""Goal: under a long mixed workload from four clients, with clients and the gateway SIGKILLed at
random, the gateway's resident memory and open fds stay flat and no load returns wrong bytes.

Four client processes (tests/support/soak_client.py: the crash test's driver, so the real plugin)
work one gateway process, each on its own 200 keys (no two clients share a key, so each client's
model of its keys is exact): stores of 4 KiB to 2.5 MiB, EXISTS, loads and deletes, up to 8 batches
in flight each, on a 64 MiB store that evicts all the time, with ``sync: always``.
Two of the clients keep their buffers in a shared-memory L1, so their stores of whole pages
go zero-copy, as in an ``lmcache server --shm-name``.
Every few seconds a random client is SIGKILLed and started again on its keys (its successor
is told which of its ops may still land). Every so often a gateway lifetime ends: all clients
are SIGKILLed and the gateway must notice and free every session; then the clients are started
again, the gateway is SIGKILLed under their traffic and started again on the same data dir, and
the clients reconnect by themselves, as the plugin does. A thread samples the gateway's
VmRSS, RssShmem and open fds (``/proc/PID``) every quarter second. The controller is in
tests/support/soak_controller.py; the sampling and the bounds of 2 and 3 in
tests/support/soak_sampling.py.

What must hold (a violation fails the test, naming what, when, and the log tails):

1. No load hit returns wrong bytes: every hit holds exactly ``content(key, length)``; nor does
   a hit or EXISTS show what the key's model rules out (a deleted key, a replaced version).
   The client checks each hit; the failure names the key, the client and its run, and the
   gateway lifetime.
2. Open fds: while clients run, at most the idle count (measured before the first client
   connects) plus ``FDS_PER_SESSION_MAX`` for each of ``clients + 2`` sessions (one killed
   and not yet noticed, one in its handshake). Once all clients are killed and the gateway has
   logged every session closed, exactly the idle count again: one leaked socket, eventfd or
   memfd per session shows there.
3. Resident memory: after a warm-up, the highest private memory sample (VmRSS less RssShmem)
   in the last third of a lifetime's run exceeds the highest in its first third by at most
   ``PRIVATE_GROWTH_MIB_MAX`` (why not VmRSS itself: see there). Once all clients are killed
   and noticed, RssShmem (the sessions' shared memory mapped in the gateway) is back under
   ``SHMEM_DRAINED_MIB_MAX``: no session mapping outlives its session.
4. Every killed gateway comes back on its data dir, every client reconnects to it within
   ``CONNECT_TIMEOUT_S``, the gateway never dies unasked, and after the final clean stop
   ``adp-gateway check`` finds no damaged record.

Short form (default, CI): 45 s of traffic, one gateway kill, a client kill every 4-7 s. Long
form (``-m slow``): 10 minutes, a gateway kill every 2-3 minutes, a client kill every 10-20 s.
``ADP_SOAK_SECONDS`` overrides the duration of both, ``ADP_SOAK_SEED`` the seed (printed with
the summary), ``ADP_SOAK_REPORT=PATH`` writes the summary as JSON, ``ADP_SOAK_KEEP=1`` keeps the
work dir (gateway log, client event logs, samples.json, data dir).

The last tests show the checks can fail: a load hit with a flipped byte (planted in the client),
gateways that leak an eventfd per closed session or 64 KiB per store
(tests/support/leaky_gateway.py), and the flatness check on synthetic samples.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.support import Gateway, remove_tree, short_tmpdir
from tests.support.soak_controller import (
    CLIENTS,
    LONG,
    NEVER,
    SHORT,
    Soak,
    SoakFailure,
    SoakPlan,
    format_summary,
)
from tests.support.soak_sampling import Sample, growth_findings

# The tests ----------------------------------------------------------------------------------


@pytest.fixture
def make_soak() -> Iterator[Callable[..., Soak]]:
    made: list[Soak] = []
    workdirs: list[Path] = []

    def make(plan: SoakPlan, **kwargs: Any) -> Soak:
        seed = int(os.environ.get("ADP_SOAK_SEED", random.randrange(2**32)))
        workdirs.append(short_tmpdir())
        made.append(Soak(workdirs[-1], plan, seed, **kwargs))
        return made[-1]

    yield make
    for soak in made:
        soak.close()
    for workdir in workdirs:
        if os.environ.get("ADP_SOAK_KEEP"):
            print(f"soak workdir kept: {workdir}")
        else:
            remove_tree(workdir)


def with_duration(plan: SoakPlan) -> SoakPlan:
    seconds = os.environ.get("ADP_SOAK_SECONDS")
    if seconds is None:
        return plan
    return replace(plan, duration_s=float(seconds))


def run_and_report(soak: Soak, capsys: pytest.CaptureFixture[str]) -> None:
    summary = soak.run()
    with capsys.disabled():
        print("\n" + format_summary(summary))
    report = os.environ.get("ADP_SOAK_REPORT")
    if report:
        Path(report).write_text(json.dumps(summary, indent=2) + "\n")
    assert summary["ops"]["load_hits_verified"] > 0, "no load ever hit: nothing was verified"
    assert summary["regions_reclaimed"] > 0, "the store never evicted"
    assert summary["client_kills"] > 0
    assert summary["zero_copy_sessions"] > 0, "no client's L1 was ever taken for zero-copy"


def test_soak_short(make_soak: Callable[..., Soak], capsys: pytest.CaptureFixture[str]) -> None:
    run_and_report(make_soak(with_duration(SHORT)), capsys)


@pytest.mark.slow
def test_soak_long(make_soak: Callable[..., Soak], capsys: pytest.CaptureFixture[str]) -> None:
    run_and_report(make_soak(with_duration(LONG)), capsys)


# The checks can fail -------------------------------------------------------------------------

PLANTED = SoakPlan("planted", 30, NEVER, NEVER, 1, 0)


class LeakyGateway(Gateway):
    """The real gateway with a planted leak (tests/support/leaky_gateway.py)."""

    leak = ""

    def spawn(self, argv: list[str], *args: Any, **kwargs: Any) -> None:
        module = [sys.executable, "-m", "tests.support.leaky_gateway", self.leak]
        super().spawn([*module, *argv[1:]], *args, **kwargs)


class FdLeakingGateway(LeakyGateway):
    leak = "fds"


class MemoryLeakingGateway(LeakyGateway):
    leak = "memory"


def test_a_load_hit_with_a_wrong_byte_fails_the_soak(make_soak: Callable[..., Soak]) -> None:
    """A planted bug (the client flips a byte of its first load hit) fails the run at once,
    naming the gateway lifetime, the client and the key."""
    soak = make_soak(PLANTED, clients=1, plant_wrong_bytes=True)
    pattern = r"gateway lifetime 1, .*client 0 \(run 1\): \[wrong_bytes\] key \d+ \(crash@"
    with pytest.raises(SoakFailure, match=pattern) as failure:
        soak.run()
    assert "bytes differ, the first at offset" in str(failure.value)


def test_a_gateway_leaking_an_fd_per_session_fails_the_soak(
    make_soak: Callable[..., Soak],
) -> None:
    """A gateway that leaves an eventfd open per closed session is caught when all clients
    are killed: one fd more than idle per session, named in the listing."""
    soak = make_soak(
        replace(PLANTED, duration_s=3), gateway_class=FdLeakingGateway, free_timeout_s=3
    )
    with pytest.raises(SoakFailure, match=r"(\d+) open fds \(idle: (\d+)\)") as failure:
        soak.run()
    text = str(failure.value)
    found = re.search(r"(\d+) of (\d+) sessions closed, (\d+) open fds \(idle: (\d+)\)", text)
    assert found is not None, text
    closed, connected, fds, idle = map(int, found.groups())
    assert closed == connected == CLIENTS and fds - idle == CLIENTS, text
    assert "anon_inode:[eventfd]" in text


def test_a_gateway_leaking_memory_per_store_fails_the_soak(
    make_soak: Callable[..., Soak],
) -> None:
    """A gateway that keeps 64 KiB per store grows its private memory far past the bound."""
    soak = make_soak(replace(PLANTED, duration_s=9), gateway_class=MemoryLeakingGateway)
    with pytest.raises(SoakFailure, match=r"private memory \(VmRSS less RssShmem\) grew"):
        soak.run()


def synthetic(private_mib: Callable[[float], float], fds: int = 6 + 4 * CLIENTS) -> list[Sample]:
    """Four samples a second for a minute; RssShmem swings as the sessions' windows do."""
    shmem_kib = [40_000 + 10_000 * (i % 7) for i in range(240)]
    return [
        Sample(i / 4, int(private_mib(i / 4) * 1024) + shmem_kib[i], shmem_kib[i], fds, "run")
        for i in range(240)
    ]


def test_the_flatness_check_on_synthetic_samples() -> None:
    """Noise and a step during the warm-up pass; a climb of 20 MiB a minute, too many fds and
    too short a run do not."""
    assert growth_findings(synthetic(lambda t: 24 + math.sin(t)), 6, 6, CLIENTS) == []
    assert growth_findings(synthetic(lambda t: 24 + 10 * (t > 3)), 6, 6, CLIENTS) == []
    [climb] = growth_findings(synthetic(lambda t: 24 + t / 3), 6, 6, CLIENTS)
    assert "private memory (VmRSS less RssShmem) grew 12.0 MiB" in climb
    [fds] = growth_findings(synthetic(lambda t: 24, fds=6 + 5 * (CLIENTS + 2) + 1), 6, 6, CLIENTS)
    assert "above 36" in fds
    [short] = growth_findings(synthetic(lambda t: 24)[:40], 6, 6, CLIENTS)
    assert "too short to judge" in short
