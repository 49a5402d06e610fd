"""What the soak test (tests/soak/test_soak.py) measures of the gateway process, and how it
judges it: samples of ``/proc/PID`` (VmRSS, RssShmem, open fds) taken on a thread through each
gateway lifetime, and the checks that say whether they stayed flat.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SAMPLE_INTERVAL_S = 0.25
# A tenant's presence table (adp_gateway/sessions/presence.py) holds two fds (its memfd, and the dup
# Python's mmap keeps) for as long as the tenant holds a key: the gateway's, not a session's.
# They are counted apart from the other fds, and at most this many per tenant.
FDS_PER_PRESENCE_TABLE = 2
PRESENCE_TABLE = "/memfd:adp-presence"
# A session holds its socket, two eventfds and its mapping (Python's mmap keeps a dup of the
# memfd), and the memfd itself as well during its handshake.
FDS_PER_SESSION_MAX = 5
# Growth of private memory (VmRSS less RssShmem) allowed from the first to the last third of a
# lifetime's run. VmRSS itself is not judged: it swings by tens of MiB as sessions come and go
# and touch more or less of their shared windows; their mappings are judged by the drain (each
# holds an fd, and RssShmem must fall to nothing). What may grow in private memory without a
# leak: the index (bounded: 800 keys), tombstones, Python's allocator keeping arenas. Healthy
# runs grow by 0.0-0.1 MiB per lifetime (private memory 23-25 MiB all through a 10-minute run).
# At about 1,000 key operations a second, 8 MiB is a leak of about 100 bytes per op over one
# 2-3 minute lifetime of the long form, or of 1 KiB per op in the short form.
PRIVATE_GROWTH_MIB_MAX = 8
SHMEM_DRAINED_MIB_MAX = 1
SAMPLES_PER_THIRD_MIN = 8


# Sampling the gateway -------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    t_s: float  # since the lifetime began
    rss_kib: int  # VmRSS
    shmem_kib: int  # RssShmem: the sessions' shared memory the gateway has touched
    fds: int  # but the presence tables'
    phase: str  # "run": clients working; "drain": clients killed; "end": before the kill
    table_fds: int = 0  # the presence tables'

    @property
    def private_kib(self) -> int:
        return self.rss_kib - self.shmem_kib


def read_sample(pid: int, since: float, phase: str) -> Sample | None:
    """One sample of process ``pid``, or None once it is gone (or a zombie)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        targets = list(_fd_targets(pid))
    except (FileNotFoundError, ProcessLookupError):
        return None
    values = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    if "VmRSS" not in values:
        return None
    rss, shmem = (int(values[name].split()[0]) for name in ("VmRSS", "RssShmem"))
    tables = sum(target.startswith(PRESENCE_TABLE) for target in targets)
    return Sample(
        round(time.monotonic() - since, 3), rss, shmem, len(targets) - tables, phase, tables
    )


def _fd_targets(pid: int) -> Iterable[str]:
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            yield os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:  # closed meanwhile
            continue


def fd_listing(pid: int) -> str:
    """What the open fds of ``pid`` point at, counted: for a failure message."""
    targets: Counter[str] = Counter()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except FileNotFoundError:
                continue
            targets[re.sub(r"\[\d+\]$", "[...]", target)] += 1
    except FileNotFoundError:
        return "(process gone)"
    return ", ".join(f"{count} x {target}" for target, count in targets.most_common())


@dataclass
class Lifetime:
    """One gateway process, from its start to its kill, and what was sampled of it."""

    number: int
    pid: int
    started: float  # monotonic
    log_mark: int  # byte offset where its part of the gateway log begins
    samples: list[Sample] = field(default_factory=list)
    phase: str = "run"
    client_kills: int = 0
    drained: Sample | None = None
    seconds: float = 0.0

    def run_samples(self) -> list[Sample]:
        return [s for s in self.samples if s.phase == "run"]

    def summary(self, fds_idle: int, warmup_s: float) -> dict[str, Any]:
        run = self.run_samples() or self.samples
        drained = self.drained
        return {
            "lifetime": self.number,
            "seconds": round(self.seconds, 1),
            "client_kills": self.client_kills,
            "samples": len(self.samples),
            "rss_mib": _range_mib(s.rss_kib for s in run),
            "private_mib": _range_mib(s.private_kib for s in run),
            "shmem_mib": _range_mib(s.shmem_kib for s in run),
            "private_growth_mib": private_growth_mib(run, warmup_s),
            "fds": [min(s.fds for s in run), max(s.fds for s in run)],
            "fds_idle": fds_idle,
            "fds_drained": drained.fds if drained else None,
            "rss_mib_drained": _mib(drained.rss_kib) if drained else None,
            "shmem_mib_drained": _mib(drained.shmem_kib) if drained else None,
        }


def _mib(kib: int) -> float:
    return round(kib / 1024, 1)


def _range_mib(values: Iterable[int]) -> list[float]:
    listed = list(values)
    return [_mib(min(listed)), _mib(max(listed))]


class Sampler:
    """Samples one lifetime's gateway every ``SAMPLE_INTERVAL_S`` on its own thread."""

    def __init__(self, lifetime: Lifetime) -> None:
        self.lifetime = lifetime
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        lifetime = self.lifetime
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            sample = read_sample(lifetime.pid, lifetime.started, lifetime.phase)
            if sample is not None:
                lifetime.samples.append(sample)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


# The checks ---------------------------------------------------------------------------------


def thirds(samples: Sequence[Sample], warmup_s: float) -> tuple[list[Sample], list[Sample]]:
    """The first and last thirds of the samples taken after the warm-up."""
    steady = [s for s in samples if s.t_s >= warmup_s]
    third = len(steady) // 3
    return steady[:third], steady[len(steady) - third :]


def private_growth_mib(samples: Sequence[Sample], warmup_s: float) -> float | None:
    """Most private memory in the last third less the most in the first (None: too few)."""
    early, late = thirds(samples, warmup_s)
    if not early:
        return None
    return _mib(max(s.private_kib for s in late) - max(s.private_kib for s in early))


def growth_findings(
    samples: Sequence[Sample], warmup_s: float, fds_idle: int, clients: int
) -> list[str]:
    """What is wrong with one lifetime's run samples (empty: flat)."""
    findings: list[str] = []
    fds_max = fds_idle + FDS_PER_SESSION_MAX * (clients + 2)
    over = [s for s in samples if s.fds > fds_max]
    if over:
        findings.append(
            f"{over[0].fds} open fds at {over[0].t_s:.1f} s (most: {max(s.fds for s in over)}), "
            f"above {fds_max}: {fds_idle} idle + {FDS_PER_SESSION_MAX} per session "
            f"for {clients} + 2 sessions"
        )
    early, late = thirds(samples, warmup_s)
    if len(early) < SAMPLES_PER_THIRD_MIN:
        findings.append(
            f"only {len(early) * 3} samples after the {warmup_s} s warm-up: too short to judge"
        )
        return findings
    growth = private_growth_mib(samples, warmup_s)
    assert growth is not None
    if growth > PRIVATE_GROWTH_MIB_MAX:
        early_max, late_max = (_mib(max(s.private_kib for s in part)) for part in (early, late))
        findings.append(
            f"private memory (VmRSS less RssShmem) grew {growth} MiB, from at most "
            f"{early_max} MiB in the first third of the run ({early[0].t_s:.0f}-"
            f"{early[-1].t_s:.0f} s) to {late_max} MiB in the last ({late[0].t_s:.0f}-"
            f"{late[-1].t_s:.0f} s); flat is at most {PRIVATE_GROWTH_MIB_MAX} MiB"
        )
    return findings
