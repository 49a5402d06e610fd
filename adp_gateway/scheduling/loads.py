"""A doorbell's loads, read together.

LMCache asks for a batch of chunks at once (a prefetch, a retrieve), and the plugin rings the
doorbell once for all of them. The session hands the loads it found behind one doorbell to the
I/O threads in groups rather than one by one: a group is one scheduler task and one pass of the
card's ``get_many``, whose fragments that lie back to back on disk (chunks stored one after
another) share one vectored read. At 256 KiB a load costs the gateway far more Python than
I/O, so grouping is what lets small objects go at the disk's pace; large objects still go
alone, so several I/O threads read them in parallel, and a small doorbell is split over a few
groups, so LMCache's batch is not read by one thread while the others idle.

A group is queued with the earliest deadline of its loads; each load still completes on its
own, and one whose deadline has passed when the group starts completes as expired.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from adp_wire.ring.layout import Submission

# A group of 256 KiB chunks (LMCache's default) holds 8 of them: eight times fewer tasks, and
# a 128-chunk batch still spreads over 16 groups, so the I/O threads keep the disk's queue
# full. A load of 2 MiB or more goes alone: its Python costs little next to its I/O, and
# several I/O threads read large objects in parallel (on the H200, groups of 8 MiB took 4 MiB
# loads from 1.08x to 0.91x fs_native's speed, one run each).
GROUP_BYTES_MAX = 2 * 2**20
GROUP_LOADS_MAX = 64
# A small doorbell (under SPREAD_GROUPS x GROUP_BYTES_MAX) is still spread over this many groups,
# down to SPREAD_BYTES_MIN each, so several I/O threads read it at once: a batch of eight 256 KiB
# chunks in one group was one vectored read on one thread while LMCache waited for all of it.
SPREAD_GROUPS = 4
SPREAD_BYTES_MIN = 512 * 2**10


@dataclass(frozen=True)
class Load:
    submission: Submission
    key: str
    extent: memoryview  # in the session's window
    object_bytes: int


def groups(loads: list[Load]) -> Iterator[list[Load]]:
    """Consecutive loads, in order, in groups of at most ``GROUP_LOADS_MAX`` loads and
    ``GROUP_BYTES_MAX`` bytes (a larger load alone); a small doorbell's groups hold at most a
    ``SPREAD_GROUPS``-th of its bytes, but never less than ``SPREAD_BYTES_MIN``. Loads of one
    group share a deadline (one batch's do): the group's task runs by it, and a load with
    time left must not expire with another's."""
    spread = -(-sum(load.object_bytes for load in loads) // SPREAD_GROUPS)
    bytes_max = min(GROUP_BYTES_MAX, max(spread, SPREAD_BYTES_MIN))
    group: list[Load] = []
    group_bytes = 0
    for load in loads:
        if group and (
            len(group) == GROUP_LOADS_MAX
            or group_bytes + load.object_bytes > bytes_max
            or load.submission.deadline_ns != group[0].submission.deadline_ns
        ):
            yield group
            group, group_bytes = [], 0
        group.append(load)
        group_bytes += load.object_bytes
    if group:
        yield group
