"""Whether the process behind the gateway's socket may be trusted with LMCache's KV cache.

The plugin hands its gateway every stored chunk, a read-only fd of L1 when L1 is shared memory,
and believes the checksums it gets back. So before it sends a hello it checks two things:

- nobody but a trusted user can have put the socket there: the socket's directory and every
  parent up to / (``adp_wire.peer.socket_directory_problem``, which the gateway asks of its
  own socket at start too);
- the process listening is a trusted user's: its uid, as the kernel reports it (SO_PEERCRED).

Trusted users are ``gateway_uids`` (by default the plugin's own user) and root. Either check
failing raises ``UntrustedGateway`` with one line naming what is wrong and how to fix it.
"""

from __future__ import annotations

import os
import socket

from adp_wire.errors import UntrustedGateway
from adp_wire.peer import credentials, socket_directory_problem, uid_names

FIX = "set the adapter's gateway_uids to the gateway's uid, or move its socket"


def trusted_uids(configured: list[int] | None) -> frozenset[int]:
    """``gateway_uids``, or the plugin's own user; and root, who owns the machine anyway."""
    return frozenset(configured if configured is not None else [os.geteuid()]) | {0}


def check_socket_directory(socket_path: str, trusted: frozenset[int]) -> None:
    problem = socket_directory_problem(socket_path, trusted)
    if problem is not None:
        raise UntrustedGateway(f"{problem}: {FIX}")


def check_peer(sock: socket.socket, socket_path: str, trusted: frozenset[int]) -> int:
    """The uid of the process listening on ``sock`` must be trusted; returns its pid."""
    peer = credentials(sock)
    if peer.uid not in trusted:
        raise UntrustedGateway(
            f"the process listening on {socket_path} (pid {peer.pid}) runs as uid {peer.uid}, "
            f"not as a trusted user ({uid_names(trusted)}): {FIX}"
        )
    return peer.pid
