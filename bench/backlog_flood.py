"""A store flood from its own process and its own plugin, for bench/backlog.py.

    python -m bench.backlog_flood --socket PATH --name NAME --out FILE \
        [--object-mib 32] [--outstanding 48] [--op-timeout-s 120] [--offered-mbps 0]

A real ``ADPConnector`` stores objects of ``--object-mib`` under keys no one else uses (so the
gateway's dedup never skips one), one key per batch as LMCache's store loop submits a chunk,
keeping ``--outstanding`` stores submitted and not yet completed, and offering at most
``--offered-mbps`` MB/s (0: no pacing). It prints ``flooding`` once the gateway answers, stops
submitting when stdin closes, waits for the stores it has out, and writes one record per store to
``--out`` as JSON: ``[submitted_s, completed_s, ok]``, times from ``time.monotonic``, which every
process on the host shares.
"""

from __future__ import annotations

import argparse
import itertools
import json
import select
import sys
import threading
import time
import zlib
from pathlib import Path

import numpy as np

from bench import plugin
from lmcache_adp import ADPConnector

SOURCE_OBJECTS = 4  # distinct source buffers; the plugin copies each into its window
DRAIN_SLACK_S = 5.0  # past the op timeout, for the last completions to arrive

Record = list[float | bool]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--socket", required=True, help="the gateway's socket")
    parser.add_argument("--name", required=True, help="makes this flood's keys its own")
    parser.add_argument("--out", type=Path, required=True, help="JSON records written here")
    parser.add_argument("--object-mib", type=int, default=32)
    parser.add_argument("--outstanding", type=int, default=48, help="stores out at once")
    parser.add_argument("--op-timeout-s", type=float, default=120.0)
    parser.add_argument("--offered-mbps", type=float, default=0.0, help="0: as fast as it can")
    return parser.parse_args(argv)


class Flood:
    """Keeps ``outstanding_max`` stores out until ``stop`` is set; records each one."""

    def __init__(self, connector: ADPConnector, name: str, object_bytes: int) -> None:
        self._connector = connector
        self._name = name
        self._object_bytes = object_bytes
        rng = np.random.default_rng(zlib.crc32(name.encode()))
        self._sources = [
            memoryview(rng.integers(0, 256, object_bytes, dtype=np.uint8).tobytes())
            for _ in range(SOURCE_OBJECTS)
        ]
        self._outstanding: dict[int, float] = {}  # future id -> submitted at
        self.submitted = 0
        self.records: list[Record] = []

    def run(
        self, outstanding_max: int, offered_bytes_s: float, stop: threading.Event, timeout_s: float
    ) -> None:
        started = time.monotonic()
        numbers = itertools.count()

        def may_submit(count: int) -> bool:
            offered = count * self._object_bytes
            return not offered_bytes_s or offered <= (time.monotonic() - started) * offered_bytes_s

        while not stop.is_set():
            while len(self._outstanding) < outstanding_max and may_submit(self.submitted):
                self._submit(next(numbers))
            self._collect(0.02)
        deadline = time.monotonic() + timeout_s + DRAIN_SLACK_S
        while self._outstanding and time.monotonic() < deadline:
            self._collect(0.1)

    def _submit(self, number: int) -> None:
        key = f"{plugin.MODEL}@{self._name}@0@{number:064x}"
        source = self._sources[number % SOURCE_OBJECTS]
        future_id = self._connector.submit_batch_set([key], [source])
        self._outstanding[future_id] = time.monotonic()
        self.submitted += 1

    def _collect(self, wait_s: float) -> None:
        ready, _, _ = select.select([self._connector.event_fd()], [], [], wait_s)
        if not ready:
            return
        for future_id, ok, _, _ in self._connector.drain_completions():
            submitted = self._outstanding.pop(future_id)
            self.records.append([submitted, time.monotonic(), bool(ok)])


def stop_at_eof(stop: threading.Event) -> None:
    sys.stdin.read()
    stop.set()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    connector = ADPConnector(socket_path=args.socket, op_timeout_s=args.op_timeout_s)
    try:
        plugin.wait_connected(connector)
        flood = Flood(connector, args.name, args.object_mib * 2**20)
        stop = threading.Event()
        threading.Thread(target=stop_at_eof, args=(stop,), daemon=True).start()
        print("flooding", flush=True)
        flood.run(args.outstanding, args.offered_mbps * 1e6, stop, args.op_timeout_s)
    finally:
        connector.close()
    args.out.write_text(json.dumps(flood.records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
