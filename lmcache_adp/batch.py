"""One ``submit_batch_*`` call from LMCache, from submit to its one completion.

A batch is reported exactly once: when its last request settles, at its deadline, or when the
plugin fails everything (gateway gone, closing). Its L1 buffers are touched by this plugin only
by copy threads, and only between ``begin_touch`` and ``end_touch``; a batch is never reported
while one of them is inside (invariant 4), and no slice of a copy starts once the batch is past
its deadline. So a batch is reported at its deadline, or at the latest when the slices in
progress then end: that is the grace past ``op_timeout_s`` (docs/design.md, "Deadlines").

``done`` and ``touching`` change under ``TOUCH_LOCK`` only; everything else belongs to the
thread that drives the link.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from adp_wire.protocol import Op

TOUCH_LOCK = threading.Lock()


@dataclass(eq=False)
class Batch:
    future_id: int
    op: Op
    keys: list[str]
    buffers: list[memoryview] | None  # LMCache's L1 buffers (GET, SET)
    timeout_s: float  # from the submit to the deadline
    deadline_ns: int = field(init=False)  # CLOCK_MONOTONIC
    results: list[bool] = field(default_factory=list)
    remaining: int = 0  # requests not settled yet
    failed: bool = False
    due: bool = False  # to be reported as soon as no copy touches its buffers
    done: bool = False  # reported; under TOUCH_LOCK
    touching: int = 0  # copies inside its L1 buffers now; under TOUCH_LOCK

    def __post_init__(self) -> None:
        self.deadline_ns = time.monotonic_ns() + int(self.timeout_s * 1e9)
        if not self.results:
            self.results = [False] * len(self.keys)

    @property
    def expired(self) -> bool:
        return time.monotonic_ns() >= self.deadline_ns

    def in_time(self) -> bool:
        """Whether a copy may still start on its buffers (checked before each slice)."""
        return not self.expired

    def begin_touch(self) -> bool:
        """Enter one of its L1 buffers (any thread); False, and stay out, once the batch is
        reported or past its deadline."""
        with TOUCH_LOCK:
            if self.done or self.expired:
                return False
            self.touching += 1
            return True

    def end_touch(self) -> None:
        with TOUCH_LOCK:
            self.touching -= 1

    def close(self) -> bool:
        """Mark the batch reported, unless a copy is inside its buffers (then it is ``due``);
        True when the caller must now report it."""
        with TOUCH_LOCK:
            if self.done:
                return False
            if self.touching:
                self.due = True
                return False
            self.done = True
            return True
