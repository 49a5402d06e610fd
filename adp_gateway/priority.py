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
  groups weighed the same (bench/results/cpu-nice-vm/).
- In cgroups with the cpu controller (containers, systemd units with CPU settings): the cgroups'
  weights, which only the deployment sets (``docker run --cpu-shares``, a pod's CPU request;
  deploy/docker/README.md).

Raising the nice value needs no privilege; nothing here fails the gateway's start.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

AUTOGROUP = Path("/proc/self/autogroup")  # "/autogroup-42 nice 0"; absent without autogroups


def lower(nice: int) -> None:
    """Give every thread of this process (and so the threads they start) and, when this
    process leads its session, its autogroup the nice value ``nice``, unless it is lower
    already. Logs what it did."""
    for thread in map(int, os.listdir("/proc/self/task")):
        try:
            if nice > os.getpriority(os.PRIO_PROCESS, thread):
                os.setpriority(os.PRIO_PROCESS, thread, nice)  # Linux: one thread's nice
        except OSError as exc:  # a thread that has ended, or a system that refuses
            log.debug("thread %d keeps its nice value: %s", thread, exc)
    group = ""
    if os.getsid(0) == os.getpid():
        try:
            if nice > _autogroup_nice():
                AUTOGROUP.write_text(f"{nice}\n")
            group = f", its session's autogroup nice {_autogroup_nice()}"
        except (OSError, ValueError, IndexError) as exc:
            log.info("the gateway's autogroup keeps its priority: %s", exc)
    threads = os.getpriority(os.PRIO_PROCESS, 0)
    log.info("CPU priority (cpu_nice %d): its threads nice %d%s", nice, threads, group)


def _autogroup_nice() -> int:
    return int(AUTOGROUP.read_text().split()[-1])
