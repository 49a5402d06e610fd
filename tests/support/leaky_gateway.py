"""The real gateway with one planted leak, for the soak test's self-tests (tests/soak/test_soak.py).

    python -m tests.support.leaky_gateway fds|memory serve ARGS...

``fds``: every closed session leaves a dup of its submission eventfd open.
``memory``: every store keeps ``LEAK_PER_STORE_BYTES`` of private memory for good.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from adp_gateway.__main__ import main
from adp_gateway.card.software import card as software_card
from adp_gateway.sessions import session

LEAK_PER_STORE_BYTES = 64 * 2**10
_kept: list[object] = []


def leak_fds() -> None:
    close = session.Session.close

    def close_leaving_an_eventfd_open(self: session.Session) -> None:
        if not self._closed:
            _kept.append(os.dup(self._submit_doorbell))
        close(self)

    session.Session.close = close_leaving_an_eventfd_open  # type: ignore[method-assign]


def leak_memory() -> None:
    put = software_card.SoftwareCard.put

    def put_keeping_memory(self: software_card.SoftwareCard, *args: Any, **kwargs: Any) -> None:
        _kept.append(b"\x01" * LEAK_PER_STORE_BYTES)
        put(self, *args, **kwargs)

    software_card.SoftwareCard.put = put_keeping_memory  # type: ignore[method-assign]


if __name__ == "__main__":
    {"fds": leak_fds, "memory": leak_memory}[sys.argv[1]]()
    sys.exit(main(sys.argv[2:]))
