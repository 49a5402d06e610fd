"""A real gateway process whose databases fail on command (the fault, lane, scheduling and
zero-copy tests of tests/integration). ``FaultyGateway`` starts one and sends it commands.

    python -m tests.support.faulty_gateway serve [adp-gateway serve's flags]

It is ``adp-gateway serve`` with each database's device wrapped in a FaultyDevice
(card/software/devices/faulty.py). One JSON command per line on stdin is applied, then logged as
``applied <line>``:

    {"database": 0, "fail": "read", "errno": 5, "count": 3}   the next 3 reads raise EIO
    {"database": 1, "delay_s": 3.0}                           every I/O first sleeps 3 s
    {"checksum_delay_s": 2.0}                                 a zero-copy store's checksums
                                                              of L1, and a remote copy out
                                                              of the client, each first
                                                              sleep 2 s
    {"clear": true}                                           no more failures or delays

A delayed I/O is logged as ``database N: holding a read`` (or write) when it starts waiting, and
a delayed checksum as ``holding a checksum``, so a test can tell that the gateway is inside an
op. It stops on SIGTERM, or when stdin closes.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from adp_gateway.__main__ import parser, serve_until_stopped
from adp_gateway.card.software import card as software_card
from adp_gateway.card.software.devices.base import Device
from adp_gateway.card.software.devices.faulty import FaultyDevice
from adp_gateway.sessions.client_l1 import L1Segment
from adp_gateway.sessions.client_process import ClientProcess
from tests.support import Gateway, wait_until

log = logging.getLogger("faulty_gateway")


class LoggedFaultyDevice(FaultyDevice):
    """A FaultyDevice that says when a delayed I/O starts waiting."""

    def __init__(self, inner: Device, database: int) -> None:
        super().__init__(inner)
        self.database = database

    def write(self, buffers: list[memoryview], offset: int) -> None:
        self._say("write")
        super().write(buffers, offset)

    def read(self, buffers: list[memoryview], offset: int) -> None:
        self._say("read")
        super().read(buffers, offset)

    def _say(self, op: str) -> None:
        if self.delay_s:
            log.info("database %d: holding a %s for %.1f s", self.database, op, self.delay_s)


class SlowChecksums:
    """Wraps ``L1Segment.checksum`` (a zero-copy store's checksums, taken from the client's
    L1) and ``ClientProcess.checksums`` (a remote copy, copied and hashed out of the client's
    memory): each first sleeps ``delay_s`` when told to."""

    def __init__(self) -> None:
        self.delay_s = 0.0
        self._checksum = L1Segment.checksum
        self._copy = ClientProcess.checksums

    def install(self) -> None:
        def checksum(segment: L1Segment, offset: int, length: int) -> int:
            self._hold()
            return self._checksum(segment, offset, length)

        def copy(
            process: ClientProcess, address: int, into: memoryview, spans: list[tuple[int, int]]
        ) -> list[int]:
            self._hold()
            return self._copy(process, address, into, spans)

        L1Segment.checksum = checksum  # type: ignore[method-assign]
        ClientProcess.checksums = copy  # type: ignore[method-assign]

    def _hold(self) -> None:
        if self.delay_s:
            log.info("holding a checksum for %.1f s", self.delay_s)
            time.sleep(self.delay_s)


CHECKSUMS = SlowChecksums()


def apply(devices: list[FaultyDevice], command: dict[str, Any]) -> None:
    if command.get("clear"):
        for device in devices:
            device.clear()
        CHECKSUMS.delay_s = 0.0
        return
    if "checksum_delay_s" in command:
        CHECKSUMS.delay_s = command["checksum_delay_s"]
        return
    device = devices[command["database"]]
    if "delay_s" in command:
        device.delay_s = command["delay_s"]
    if "fail" in command:
        device.fail(command["fail"], command["errno"], command["count"])


def read_commands(devices: list[FaultyDevice]) -> None:
    for line in sys.stdin:
        apply(devices, json.loads(line))
        log.info("applied %s", line.strip())
    os.kill(os.getpid(), signal.SIGTERM)  # stdin closed: the test is gone


def main() -> int:
    args = parser().parse_args(sys.argv[1:])
    devices: list[FaultyDevice] = []

    def wrap(device: Device) -> Device:
        devices.append(LoggedFaultyDevice(device, len(devices)))
        return devices[-1]

    software_card.wrap_device = wrap  # every device the software card opens
    CHECKSUMS.install()
    threading.Thread(target=read_commands, args=(devices,), daemon=True).start()
    return serve_until_stopped(args)


class FaultyGateway(Gateway):
    stdin = subprocess.PIPE

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "tests.support.faulty_gateway", "serve", *self.args]

    def inject(self, **command: object) -> None:
        line = json.dumps(command)
        mark = len(self.log())
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()
        wait_until(lambda: f"applied {line}" in self.log()[mark:], 10, f"fault {line}")


if __name__ == "__main__":
    sys.exit(main())
