"""The gateway's Unix socket: claiming its path (a directory only the gateway's user can write,
no live gateway already there), binding it for the configured group, and who is at the other
end of a connection (SO_PEERCRED: the kernel's word, not the client's)."""

from __future__ import annotations

import contextlib
import errno
import grp
import os
import socket
import stat
import struct

from adp_gateway import config as config_module
from adp_gateway.errors import StartupError
from adp_gateway.tenants import Peer

_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def peer_of(conn: socket.socket) -> Peer:
    """The connecting process, as the kernel saw it connect."""
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    except OSError:
        return Peer(-1, -1, -1)  # matches no tenant's uids or gids
    return Peer(*_PEERCRED.unpack(creds))


def claim(path: str, group: str | None) -> None:
    """Make the socket's directory ready, and refuse a path a live gateway serves."""
    _prepare_dir(os.path.dirname(os.path.abspath(path)), group)
    if not os.path.exists(path):
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError as exc:
        if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise StartupError(f"cannot check the socket {path}: {exc.strerror}") from exc
        os.unlink(path)  # left behind by a gateway that died
    else:
        raise StartupError(
            f"{path} is already served by a live gateway: stop it first, or "
            "give this one another `--socket`"
        )
    finally:
        probe.close()


def _prepare_dir(directory: str, group: str | None) -> None:
    """Create the socket's directory (mode 0750), and refuse one that another user owns or can
    write: whoever can write it could put a socket of their own in the gateway's place."""
    parent = os.path.dirname(directory)
    config_module.make_dir(parent, 0o755, "the socket's parent directory", "--socket")
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o750)
    info = os.lstat(directory)
    fix = "remove it, or give the gateway another `--socket`"
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise StartupError(f"the socket's directory {directory} is not a directory: {fix}")
    if info.st_uid != os.geteuid():
        raise StartupError(
            f"the socket's directory {directory} belongs to uid {info.st_uid}, not to the "
            f"gateway's user ({os.geteuid()}), who could replace the socket: {fix}"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise StartupError(
            f"the socket's directory {directory} is writable by other users (mode "
            f"{stat.S_IMODE(info.st_mode):o}), who could replace the socket: `chmod go-w` it, "
            "or give the gateway another `--socket`"
        )
    if group is not None:  # its members must reach the socket through the directory
        os.chown(directory, -1, _group_id(group))
        os.chmod(directory, stat.S_IMODE(info.st_mode) | 0o050)


def listen(path: str, group: str | None) -> socket.socket:
    """Bind the Unix socket (its directory was claimed by ``claim``)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
    except OSError as exc:
        listener.close()
        raise StartupError(
            f"cannot bind {path}: {exc.strerror}; choose another `--socket`"
        ) from exc
    os.chmod(path, 0o660)
    if group is not None:
        try:
            os.chown(path, -1, _group_id(group))
        except OSError as exc:
            listener.close()
            raise StartupError(
                f"cannot give the socket to group {group!r}: {exc.strerror}; fix `socket_group`"
            ) from exc
    listener.listen(64)
    return listener


def _group_id(group: str) -> int:
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise StartupError(f"socket_group: no group named {group!r}; fix `socket_group`") from None
