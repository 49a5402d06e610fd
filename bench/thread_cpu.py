"""CPU seconds of a process's threads, summed by role: what each part of the plugin and of the
gateway costs per GB moved (docs/operations.md, "Sizing"). Every thread of both carries its name
into the OS (adp_wire/threads.py); a role is that name without its trailing number (``io-3`` is
``io``, ``adp-copy-0`` is ``adp-copy``), so a pool's threads add up to one figure.

Threads that ended between two samples are missed: the roles measured here (the gateway's I/O
threads, the plugin's copy threads and link) live as long as the process.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from pathlib import Path

_TRAILING_NUMBER = re.compile(r"[-_]?\d+$")


def role(thread_name: str) -> str:
    return _TRAILING_NUMBER.sub("", thread_name) or thread_name


def by_role(pid: int) -> dict[str, float]:
    """User + system CPU seconds so far of each role's threads in process ``pid``."""
    ticks = os.sysconf("SC_CLK_TCK")
    seconds: dict[str, float] = defaultdict(float)
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            text = (task / "stat").read_text()
        except OSError:  # the thread ended
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text[text.rindex(")") + 2 :].split()
        seconds[role(name)] += (int(fields[11]) + int(fields[12])) / ticks
    return dict(seconds)


def per_gb(before: dict[str, float], after: dict[str, float], moved_bytes: int) -> dict[str, float]:
    """CPU seconds per GB (10^9 bytes) of each role between two samples, the busiest first;
    roles that used under 1 ms are left out."""
    used = {name: after[name] - before.get(name, 0.0) for name in after}
    return {
        name: seconds * 1e9 / moved_bytes
        for name, seconds in sorted(used.items(), key=lambda item: -item[1])
        if seconds >= 0.001
    }
