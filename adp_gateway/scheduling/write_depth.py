"""How many bytes of stores may write at once: what the databases drain in ``DRAIN_S``.

A load that arrives while stores write queues at the device behind what they have in flight, so
the scheduler bounds it. A fixed number of bytes suits one device and starves another: 64 MiB is
32 ms of a 2 GB/s disk, but a couple of milliseconds of tmpfs or a Gen5 drive, where it keeps
two 32 MiB stores writing and leaves the rest of the drive idle (on an H100 host with the
databases on tmpfs, stores of 32 MiB ran at 0.3x fs_native with 64 MiB). So by default the bound
is time, not bytes: as many bytes as the stores were last seen to write in ``DRAIN_S``, never
fewer than ``FLOOR_BYTES``. The rate is measured over the stores that ended in the last
``WINDOW_S``: their bytes over the time some store was writing (the union of their spans, so
stores written side by side count once). It grows while the device keeps up with more in flight
(the rate rises with the depth) and stops where the device is saturated (there the rate does
not). A ``store_inflight_max`` in the config fixes it instead.
"""

from __future__ import annotations

from collections import deque
from typing import Final

DRAIN_S: Final = 0.025
FLOOR_BYTES: Final = 64 * 2**20
WINDOW_S: Final = 1.0
SPANS_MAX: Final = 512  # the measure's memory, whatever the rate of stores
# The limit is worked out again at most this often: at thousands of small stores a second,
# sorting the window's spans at every one cost the gateway a tenth of its Python time.
RECOMPUTE_NS: Final = 10_000_000


class WriteDepth:
    """Not thread-safe: the scheduler calls it under its own lock."""

    def __init__(self, fixed_bytes: int | None = None) -> None:
        self._fixed = fixed_bytes
        self._spans: deque[tuple[int, int, int]] = deque(maxlen=SPANS_MAX)  # start, end, bytes
        self._limit = fixed_bytes if fixed_bytes is not None else FLOOR_BYTES
        self._computed_ns = 0  # when the limit was last worked out

    def limit(self) -> int:
        """The bytes of stores that may write at once now (one store always may)."""
        return self._limit

    def wrote(self, nbytes: int, started_ns: int, ended_ns: int) -> None:
        """A store wrote ``nbytes`` from ``started_ns`` to ``ended_ns`` (CLOCK_MONOTONIC)."""
        if self._fixed is not None or nbytes <= 0 or ended_ns <= started_ns:
            return
        self._spans.append((started_ns, ended_ns, nbytes))
        if ended_ns - self._computed_ns < RECOMPUTE_NS:
            return
        self._computed_ns = ended_ns
        while self._spans and self._spans[0][1] < ended_ns - WINDOW_S * 1e9:
            self._spans.popleft()
        self._limit = max(FLOOR_BYTES, int(self.rate_bytes_per_s() * DRAIN_S))

    def rate_bytes_per_s(self) -> float:
        """The stores' bytes over the time some store wrote, in the window."""
        busy_ns, reach = 0, 0
        for start, end, _ in sorted(self._spans):
            if end > reach:
                busy_ns += end - max(start, reach)
                reach = end
        written = sum(nbytes for _, _, nbytes in self._spans)
        return written / (busy_ns / 1e9) if busy_ns else 0.0
