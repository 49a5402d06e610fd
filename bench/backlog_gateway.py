"""``adp-gateway serve`` that also logs its scheduler's queues, for bench/backlog.py.

    python -m bench.backlog_gateway serve [adp-gateway serve's flags]

Every ``SAMPLE_INTERVAL_S`` its scheduler's statistics (what is queued and not yet started:
the tasks of each class and the bytes of queued stores) are logged when they changed, as

    queues at T: loads L, stores S, deletes D, store backlog B bytes

with T from ``time.monotonic``, which every process on the host shares, so the benchmark can
tell how deep the queue was when each of its loads ran. Nothing else differs from the gateway.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import time

from adp_gateway import service
from adp_gateway.__main__ import parser, serve_until_stopped
from adp_gateway.scheduling.scheduler import SchedulerStatistics

SAMPLE_INTERVAL_S = 0.05
SAMPLE = re.compile(
    r"queues at ([\d.]+): loads (\d+), stores (\d+), deletes (\d+), store backlog (\d+) bytes"
)
log = logging.getLogger("backlog_gateway")


class SampledGateway(service.Gateway):
    """The gateway, plus a thread that logs its scheduler's statistics while it runs."""

    def start(self) -> None:
        super().start()
        self._sampling = threading.Event()
        self._sampling.set()
        threading.Thread(target=self._sample, name="sampler", daemon=True).start()

    def stop(self) -> None:
        self._sampling.clear()
        super().stop()

    def _sample(self) -> None:
        last: SchedulerStatistics | None = None
        while self._sampling.is_set():
            stats = self.scheduler.statistics()
            if stats != last:
                loads, stores, deletes = stats.queued
                log.info(
                    "queues at %.3f: loads %d, stores %d, deletes %d, store backlog %d bytes",
                    time.monotonic(),
                    loads,
                    stores,
                    deletes,
                    stats.store_backlog_bytes,
                )
                last = stats
            time.sleep(SAMPLE_INTERVAL_S)


def samples(log_text: str) -> list[tuple[float, int, int]]:
    """(time, queued stores, store backlog bytes) of each sample in a gateway log."""
    return [(float(m[1]), int(m[3]), int(m[5])) for m in SAMPLE.finditer(log_text)]


def main() -> int:
    service.Gateway = SampledGateway  # type: ignore[misc]  # serve_until_stopped imports it late
    return serve_until_stopped(parser().parse_args(sys.argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
