"""Whether the process behind the gateway's socket may be trusted with LMCache's KV cache.

The plugin hands its gateway every stored chunk, a read-only fd of L1 when L1 is shared memory,
and believes the checksums it gets back. So before it sends a hello it checks two things:

- nobody but a trusted user can have put the socket there: the socket's directory and every
  parent up to / are real directories (a symlink is refused, never followed), owned by a
  trusted user and writable by nobody else. A parent may be a sticky directory such as /tmp,
  where others cannot rename or remove what is not theirs; and every parent counts, root-owned
  or not, since whoever owns one could swap what lies below it;
- the process listening is a trusted user's: its uid, as the kernel reports it (SO_PEERCRED).

Trusted users are ``gateway_uids`` (by default the plugin's own user) and root. Either check
failing raises ``UntrustedGateway`` with one line naming what is wrong and how to fix it.
"""

from __future__ import annotations

import os
import socket
import stat
import struct

from adp_wire.errors import UntrustedGateway

_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
FIX = "set the adapter's gateway_uids to the gateway's uid, or move its socket"


def trusted_uids(configured: list[int] | None) -> frozenset[int]:
    """``gateway_uids``, or the plugin's own user; and root, who owns the machine anyway."""
    return frozenset(configured if configured is not None else [os.geteuid()]) | {0}


def check_socket_directory(socket_path: str, trusted: frozenset[int]) -> None:
    directory = os.path.dirname(os.path.abspath(socket_path))
    path = directory
    while True:
        try:
            info = os.lstat(path)
        except OSError as exc:
            raise UntrustedGateway(f"cannot check {path}: {exc.strerror}") from exc
        if stat.S_ISLNK(info.st_mode):
            raise UntrustedGateway(
                f"{path} (on the way to the gateway's socket {socket_path}) is a symlink, "
                f"which anyone who can write its parent could redirect: {FIX}"
            )
        if not stat.S_ISDIR(info.st_mode):
            raise UntrustedGateway(f"{path} is not a directory")
        if info.st_uid not in trusted:
            raise UntrustedGateway(
                f"{path} (holding the gateway's socket {socket_path}) is owned by uid "
                f"{info.st_uid}, not by a trusted user ({_names(trusted)}): {FIX}"
            )
        shared = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if shared and (path == directory or not info.st_mode & stat.S_ISVTX):
            raise UntrustedGateway(
                f"{path} (holding the gateway's socket {socket_path}) is writable by other "
                f"users (mode {stat.S_IMODE(info.st_mode):o}), who could put a socket of "
                f"their own there: {FIX}"
            )
        parent = os.path.dirname(path)
        if parent == path:
            return
        path = parent


def check_peer(sock: socket.socket, socket_path: str, trusted: frozenset[int]) -> int:
    """The uid of the process listening on ``sock`` must be trusted; returns its pid."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    pid, uid, _ = _PEERCRED.unpack(creds)
    if uid not in trusted:
        raise UntrustedGateway(
            f"the process listening on {socket_path} (pid {pid}) runs as uid {uid}, not as a "
            f"trusted user ({_names(trusted)}): {FIX}"
        )
    return int(pid)


def _names(uids: frozenset[int]) -> str:
    return "uids " + ", ".join(map(str, sorted(uids)))
