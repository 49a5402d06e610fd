"""The gateway's CPU priority, below the model server's: on a busy host, LMCache's lookups and
vLLM's own threads run first, and the gateway's work (a store's checksums and copies) waits.

Where the kernel compares the gateway with LMCache decides what has to change:

- In one scheduling group (both started from one shell, or in one container): the nice value of
  the gateway's threads. It is set on each thread there is (libraries start some as they are
  imported) before the gateway starts its own, which inherit it.
- In groups of their own: their groups' weights. Processes that lead sessions of their own
  (``setsid``, as ``scripts/serve.sh`` starts the gateway) each get an autogroup, and a thread's
  nice value then counts only within its group. So a gateway that leads its session also gives
  its autogroup that nice value (``/proc/self/autogroup``). Measured on a 2-core VM: a lookup
  that wakes while a gateway thread checksums a store waited up to 6 ms for its CPU when the
  groups weighed the same (``git show a7353c1:bench/results/cpu-nice-vm/``).
- In cgroups with the cpu controller (containers, systemd units with CPU settings): the cgroups'
  weights, which only the deployment sets (``docker run --cpu-shares``, a pod's CPU request;
  deploy/docker/README.md).

A gateway that lowered its autogroup gives it back the priority it started with (``Boost``)
while it must not wait (a thread's nice value cannot come back down without privilege; an
autogroup's can):

- while loads run or wait, and for ``LINGER_S`` after the last: LMCache is waiting for them,
  not competing with them. On the 2-core VM a 2 GB restore took about 10% longer at nice 19
  than at nice 0 without this (``git show a7353c1:bench/results/cpu-nice-vm/``), and as long
  with it (``git show a7353c1:bench/results/load-boost-vm/``);
- while a store has waited longer than ``STORE_PATIENCE_S``: a gateway at nice 19 that any
  busier process outweighs would otherwise let stores it could take wait until their
  deadline and fail (on the 2-core VM, with the harness of ``lmcache bench l2`` spinning its
  OpenMP threads beside it, stores crawled at 30-110 MB/s at nice 19 against 1.2-1.6 GB/s at
  nice 0). A store that ends within the patience, as every one does on a host with CPU to
  spare, never raises it, so lookups keep the CPU first while the tier keeps up.

Raising the nice value needs no privilege; nothing here fails the gateway's start.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

AUTOGROUP = Path("/proc/self/autogroup")  # "/autogroup-42 nice 0"; absent without autogroups
# How long the autogroup stays at its starting priority after the last load: a restore's batches
# come a few ms apart, and the kernel takes an unprivileged change at most every 100 ms.
LINGER_S = 0.3
# A store waiting longer than this (its deadline is op_timeout_s, 10 s by default) means the
# gateway is starved of CPU, not that the disk is slow: it takes its priority back.
STORE_PATIENCE_S = 1.0


def lower(nice: int) -> Boost | None:
    """Give every thread of this process (and so the threads they start) and, when this
    process leads its session, its autogroup the nice value ``nice``, unless it is lower
    already. Logs what it did. Returns the autogroup's ``Boost`` when it lowered it."""
    for thread in map(int, os.listdir("/proc/self/task")):
        try:
            if nice > os.getpriority(os.PRIO_PROCESS, thread):
                os.setpriority(os.PRIO_PROCESS, thread, nice)  # Linux: one thread's nice
        except OSError as exc:  # a thread that has ended, or a system that refuses
            log.debug("thread %d keeps its nice value: %s", thread, exc)
    group, boost = "", None
    if os.getsid(0) == os.getpid():
        try:
            started = _autogroup_nice()
            if nice > started:
                AUTOGROUP.write_text(f"{nice}\n")
                boost = Boost(started, nice)
            group = f", its session's autogroup nice {_autogroup_nice()}"
            if boost is not None:
                group += f" ({started} while loads run or stores wait)"
        except (OSError, ValueError, IndexError) as exc:
            log.info("the gateway's autogroup keeps its priority: %s", exc)
    threads = os.getpriority(os.PRIO_PROCESS, 0)
    log.info("CPU priority (cpu_nice %d): its threads nice %d%s", nice, threads, group)
    return boost


class Boost:
    """The gateway's autogroup at the priority it started with while its work must not wait
    (see the module's docstring), and at ``cpu_nice`` otherwise. ``load_arrived`` (the
    scheduler, on each queued load, once it is queued) raises it at once; ``settle`` (the
    housekeeping thread, every 0.1 s) raises it while ``wanted()`` says so (a load runs or
    waits, a store waited too long), lowers it once that has not been so for ``LINGER_S``
    since the last load, and retries a change the kernel refused (it takes one from an
    unprivileged process at most every 100 ms, EAGAIN otherwise). Both run under one lock, so
    a load queued while ``settle`` decides is never left at the low priority.
    """

    def __init__(self, started: int, lowered: int) -> None:
        self._nice = {True: started, False: lowered}  # by "raised"
        self._raised = False
        self._last_load = 0.0  # monotonic
        self._lock = threading.Lock()

    def load_arrived(self) -> None:
        with self._lock:
            self._last_load = time.monotonic()
            if not self._raised:
                self._set(True)

    def settle(self, wanted: Callable[[], bool]) -> None:
        with self._lock:
            raised = wanted() or time.monotonic() - self._last_load < LINGER_S
            if raised != self._raised:
                self._set(raised)

    def _set(self, raised: bool) -> None:
        try:
            AUTOGROUP.write_text(f"{self._nice[raised]}\n")
        except OSError as exc:  # EAGAIN: too soon after another change; settle retries
            log.debug("the autogroup keeps nice %d for now: %s", self._nice[self._raised], exc)
            return
        self._raised = raised


def _autogroup_nice() -> int:
    return int(AUTOGROUP.read_text().split()[-1])
