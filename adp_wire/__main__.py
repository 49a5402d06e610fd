"""Print a value of the contract for shell scripts, which then need not write it out.

python -m adp_wire socket-path   # where the gateway listens and the plugin looks by default
python -m adp_wire versions      # "protocol P layout L": equal on both sides or no session
"""

from __future__ import annotations

import sys

from adp_wire.protocol import PROTOCOL_VERSION, default_socket_path
from adp_wire.ring.layout import LAYOUT_VERSION

USAGE = "usage: python -m adp_wire socket-path|versions"


def main(argv: list[str]) -> int:
    if argv == ["socket-path"]:
        print(default_socket_path())
    elif argv == ["versions"]:
        print(f"protocol {PROTOCOL_VERSION} layout {LAYOUT_VERSION}")
    else:
        print(USAGE, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
