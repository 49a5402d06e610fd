"""The soak test's client process: the crash test's driver on one client's own slice of keys.

    python -m tests.support.soak_client --socket PATH --state STATE.json --events EVENTS.jsonl \\
        --seed N --client C --keys-per-client K

It is tests/support/crash_driver.py (the real plugin, up to ``INFLIGHT_MAX`` batches of stores,
loads, EXISTS and deletes, every load hit checked byte for byte against ``content(key, length)``,
every event logged as one JSON line) with three differences:

- Keys: client C works keys ``[C * K, (C + 1) * K)`` only. No two clients touch one key, so the
  per-key ordering the driver keeps (one op per key in flight) is all the ordering there is, and
  each client's model is exact for its keys whatever the other clients do.
- It lives across gateway kills (the plugin reconnects by itself). The controller sends SIGUSR1
  once a killed gateway is confirmed dead and before it starts the next one; at its next step
  the client ends the gateway lifetime in its model (ops that failed without a verdict cannot
  take effect any more) and logs a ``lifetime_end`` event, which the controller waits for.
- The state it starts from carries ``floating`` as well: ops of a SIGKILLed predecessor that the
  gateway may still carry out, until the gateway's lifetime ends.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from types import FrameType

from tests.support.crash_driver import Driver, _parser
from tests.support.crash_model import HOT_KEYS


class SoakClient(Driver):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.first_key: int = args.client * args.keys_per_client
        self.key_count: int = args.keys_per_client
        assert self.first_key + self.key_count <= self.model.keys
        self.lifetime_ended = False  # set by SIGUSR1, handled at the next step of the loop
        floating = _read_floating(args.state)
        for key, states in floating.items():
            self.model.states[key].floating = set(states)

    def _pick_keys(self, count: int) -> list[int]:
        keys: list[int] = []
        for _ in range(count * 4):
            if len(keys) == count:
                break
            hot = self.rng.random() < 0.5
            key = self.first_key + self.rng.randrange(
                min(HOT_KEYS, self.key_count) if hot else self.key_count
            )
            if key not in self.busy and key not in keys:
                keys.append(key)
        return keys

    def _fill(self) -> None:
        # Here and not in the signal handler: between two events, so that the event log and the
        # model see the lifetime end at the same point.
        if self.lifetime_ended:
            self.lifetime_ended = False
            self.model.end_lifetime()
            self.log.write(ev="lifetime_end")
        super()._fill()


def _read_floating(state_path: str) -> dict[int, list[int]]:
    state = json.loads(Path(state_path).read_text())
    return {int(key): states for key, states in state.get("floating", {}).items()}


def _soak_parser() -> argparse.ArgumentParser:
    parser = _parser()
    parser.prog = "python -m tests.support.soak_client"
    parser.add_argument("--client", type=int, required=True, help="which slice of keys")
    parser.add_argument("--keys-per-client", type=int, required=True)
    return parser


def main(argv: list[str] | None = None) -> int:
    client = SoakClient(_soak_parser().parse_args(argv))

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        client.stopping = True

    def on_sigusr1(signum: int, frame: FrameType | None) -> None:
        client.lifetime_ended = True

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGUSR1, on_sigusr1)
    try:
        return client.run()
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(main())
