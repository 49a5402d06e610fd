"""LMCache's batches from admission to their one report, and their deadlines.

A batch is reported when its last request settles; at once when the lanes refuse it or none of
its keys can travel; at its deadline (failed); when the plugin fails everything; or, still in
the inbox when the plugin closes, by ``refuse``. Never while a copy is inside one of its
buffers, but as soon as that copy ends (lmcache_adp/batch.py). Before a failed store is
reported, its zero-copy requests still at the gateway are given up (``give_up``), since LMCache
may rewrite the buffers from then on.

Used by one thread at a time: the link's, then, once it has stopped, the one closing the plugin.
"""

from __future__ import annotations

import heapq
import time
from collections import Counter
from collections.abc import Callable

from adp_wire.protocol import Op, Status
from adp_wire.trace import Stage, mark
from lmcache_adp.batch import Batch
from lmcache_adp.completions import CompletionQueue
from lmcache_adp.link import Request
from lmcache_adp.logs import log
from lmcache_adp.untaken import Untaken

LINGERING_MAX = 256  # reported batches the deadline heap may hold while the plugin runs
TIMEOUT_LINE_S = 10.0  # after an op's timeout line, its next timeouts fold into the next line


class Outcomes:
    def __init__(
        self, completions: CompletionQueue, give_up: Callable[[Batch], None], untaken: Untaken
    ) -> None:
        self._completions = completions
        self._give_up = give_up
        self._untaken = untaken
        self._active: dict[int, Batch] = {}  # future id -> batch not reported yet
        self._deadlines: list[tuple[int, int, Batch]] = []  # heap; reported batches linger
        self._timeout_lines = TimeoutLines()

    def track(self, batch: Batch) -> None:
        self._active[batch.future_id] = batch
        heapq.heappush(self._deadlines, (batch.deadline_ns, batch.future_id, batch))
        if len(self._deadlines) > len(self._active) + LINGERING_MAX:
            self._forget_reported()

    def ms_to_next_deadline(self, longest_ms: int) -> int:
        """How long the link's thread may sleep before a batch is due: at most ``longest_ms``."""
        while self._deadlines and self._deadlines[0][2].done:
            heapq.heappop(self._deadlines)
        if not self._deadlines:
            return longest_ms
        until_ms = (self._deadlines[0][0] - time.monotonic_ns()) // 1_000_000 + 1
        return max(0, min(longest_ms, until_ms))

    def settle(self, request: Request, status: Status, results: list[bool] | None = None) -> None:
        """Record a request's outcome in its batch; report the batch when it is the last one
        (or when it was due and waited only for this)."""
        batch = request.batch
        if batch.done:
            return
        if status == Status.OK:
            values = results if results is not None else [True] * len(request.keys)
            batch.results[request.first : request.first + len(values)] = values
        elif status != Status.MISS:
            batch.failed = True
        batch.remaining -= 1
        if batch.remaining == 0 or batch.due:
            self.conclude(batch)

    def conclude(self, batch: Batch, failed: bool = False) -> None:
        """Report ``batch`` now, or as soon as no copy is inside its buffers."""
        batch.failed |= failed
        if not batch.close():
            return
        del self._active[batch.future_id]
        if batch.op == Op.SET:
            self._untaken.count(batch)
            if batch.failed:
                self._give_up(batch)
        ok = not batch.failed and (batch.op != Op.SET or all(batch.results))
        error = "" if ok else f"{batch.op.name} failed for some keys"
        self._completions.push(batch.future_id, ok, error, batch.results)
        mark(Stage.REPORT, batch.future_id)

    def refuse(self, batch: Batch, why: str) -> None:
        """Report, failed, a batch that never reached the lanes (no copy has touched it)."""
        if batch.close():
            if batch.op == Op.SET:
                self._untaken.count(batch)
            self._completions.push(batch.future_id, False, why, batch.results)
            mark(Stage.REPORT, batch.future_id)

    def expire(self) -> None:
        """Fail every batch past its deadline."""
        now = time.monotonic_ns()
        while self._deadlines and self._deadlines[0][0] <= now:
            batch = heapq.heappop(self._deadlines)[2]
            if batch.done:
                continue
            self._timeout_lines.timed_out(batch, now / 1e9)
            self.conclude(batch, failed=True)

    def fail_all(self) -> None:
        for batch in list(self._active.values()):
            self.conclude(batch, failed=True)
        self._forget_reported()

    def _forget_reported(self) -> None:
        """Drop reported batches from the deadline heap. A reported batch still holds LMCache's
        buffers; after the plugin closes, no reference to them is left here (LMCache may unmap
        its L1), and while it runs, at most ``LINGERING_MAX`` of them."""
        self._deadlines = [entry for entry in self._deadlines if not entry[2].done]
        heapq.heapify(self._deadlines)


class TimeoutLines:
    """A warning for an op's timed-out batch, then none for that op for ``TIMEOUT_LINE_S``:
    the next line counts the batches folded since. A hung gateway expires every batch, and
    LMCache's log must not take a line for each."""

    def __init__(self) -> None:
        self._quiet_until: dict[Op, float] = {}
        self._folded: Counter[Op] = Counter()

    def timed_out(self, batch: Batch, now_s: float) -> None:
        op = batch.op
        if now_s < self._quiet_until.get(op, 0.0):
            self._folded[op] += 1
            return
        folded = self._folded.pop(op, 0)
        more = f" (and {folded} more since the last such line)" if folded else ""
        log.warning(
            "%s of %d keys timed out after %.1f s%s",
            op.name,
            len(batch.keys),
            batch.timeout_s,
            more,
        )
        self._quiet_until[op] = now_s + TIMEOUT_LINE_S
