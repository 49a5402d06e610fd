"""Who is at the other end of the gateway's socket, and who could have put the socket there.

Both sides ask the same question of the socket's directory, so that a gateway never starts
where its plugins would refuse it: the directory and every parent up to / must be real
directories (a symlink is refused, never followed), owned by a trusted user and writable by
nobody else. A parent may be a sticky directory such as /tmp, where others cannot rename or
remove what is not theirs; every parent counts, root-owned or not, since whoever owns one could
swap what lies below it.
"""

from __future__ import annotations

import os
import socket
import stat
import struct
from typing import NamedTuple

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class Credentials(NamedTuple):
    pid: int
    uid: int
    gid: int


def credentials(sock: socket.socket) -> Credentials:
    """The process at the other end of ``sock``, as the kernel saw it connect or listen
    (SO_PEERCRED: the kernel's word, not the peer's). Raises OSError."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    return Credentials(*_UCRED.unpack(raw))


def socket_directory_problem(socket_path: str, trusted: frozenset[int]) -> str | None:
    """What lets a user outside ``trusted`` put a socket at ``socket_path`` (the module's
    doc), in words that name the path; None when nothing does."""
    directory = os.path.dirname(os.path.abspath(socket_path))
    path = directory
    while True:
        try:
            info = os.lstat(path)
        except OSError as exc:
            return f"cannot check {path}: {exc.strerror}"
        if stat.S_ISLNK(info.st_mode):
            return (
                f"{path} (on the way to the gateway's socket {socket_path}) is a symlink, "
                "which anyone who can write its parent could redirect"
            )
        if not stat.S_ISDIR(info.st_mode):
            return f"{path} is not a directory"
        if info.st_uid not in trusted:
            return (
                f"{path} (holding the gateway's socket {socket_path}) is owned by uid "
                f"{info.st_uid}, not by a trusted user ({uid_names(trusted)})"
            )
        shared = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if shared and (path == directory or not info.st_mode & stat.S_ISVTX):
            return (
                f"{path} (holding the gateway's socket {socket_path}) is writable by other "
                f"users (mode {stat.S_IMODE(info.st_mode):o}), who could put a socket of "
                "their own there"
            )
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


def uid_names(uids: frozenset[int]) -> str:
    return "uids " + ", ".join(map(str, sorted(uids)))
