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

from adp_gateway import config as config_module
from adp_gateway.errors import StartupError
from adp_gateway.front.tenants import Peer
from adp_wire.peer import credentials, socket_directory_problem

# Connections the kernel queues for accept (capped by net.core.somaxconn): a burst, or a gateway
# short of CPU, must not turn clients away with EAGAIN (they also retry: lmcache_adp/link.py).
LISTEN_BACKLOG = 1024
PROBE_TIMEOUT_S = 2.0  # a live gateway accepts at once (the kernel queues the connection)


def peer_of(conn: socket.socket) -> Peer:
    """The connecting process, as the kernel saw it connect."""
    try:
        return Peer(*credentials(conn))
    except OSError:
        return Peer(-1, -1, -1)  # matches no tenant's uids or gids


def claim(path: str, group: str | None) -> None:
    """Make the socket's directory ready, and refuse a path a live gateway serves. Only a
    socket is ever removed there (one left by a gateway that died): anything else at the path
    (a config or token file given to ``--socket`` by mistake, a directory) is refused, never
    deleted."""
    _prepare_dir(os.path.dirname(os.path.abspath(path)), group)
    problem = socket_directory_problem(path, frozenset({os.geteuid(), 0}))
    if problem is not None:  # its plugins would refuse the gateway (lmcache_adp/trust.py)
        raise StartupError(f"{problem}: give the gateway another `--socket`")
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StartupError(f"cannot check the socket {path}: {exc.strerror}") from exc
    if not stat.S_ISSOCK(info.st_mode):
        raise StartupError(
            f"{path} is {_kind_of(info.st_mode)}, not a socket: the gateway replaces only a "
            "socket a gateway left behind; give `--socket` (or `socket:`) the socket's own path"
        )
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(PROBE_TIMEOUT_S)
        probe.connect(path)
    except OSError as exc:
        if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise StartupError(f"cannot check the socket {path}: {exc.strerror}") from exc
        _unlink_if(path, info)  # left behind by a gateway that died
    else:
        raise StartupError(
            f"{path} is already served by a live gateway: stop it first, or "
            "give this one another `--socket`"
        )
    finally:
        probe.close()


def bound_identity(path: str) -> os.stat_result:
    """The socket file ``listen`` made at ``path``, so that ``release_path`` removes that one
    and no other."""
    return os.lstat(path)


def release_path(path: str, identity: os.stat_result | None) -> None:
    """Remove the socket at ``path`` if it is still the file ``identity`` describes."""
    if identity is None:
        return
    with contextlib.suppress(OSError):
        current = os.lstat(path)
        if stat.S_ISSOCK(current.st_mode) and _same_inode(identity, current):
            os.unlink(path)


def _same_inode(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _unlink_if(path: str, seen: os.stat_result) -> None:
    """Unlink the stale socket ``seen`` at ``path``, unless something else took its place."""
    with contextlib.suppress(FileNotFoundError):
        current = os.lstat(path)
        if stat.S_ISSOCK(current.st_mode) and _same_inode(seen, current):
            os.unlink(path)


def _kind_of(mode: int) -> str:
    kinds = [
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISCHR, "a character device"),
    ]
    return next((name for test, name in kinds if test(mode)), "not a socket")


def _prepare_dir(directory: str, group: str | None) -> None:
    """Create the socket's directory (mode 0750), and refuse one that another user owns or can
    write: whoever can write it could put a socket of their own in the gateway's place."""
    parent = os.path.dirname(directory)
    config_module.make_dir(parent, 0o755, "the socket's parent directory", "--socket")
    try:
        os.mkdir(directory, 0o750)
        made = True
    except FileExistsError:
        made = False
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
    if group is None:
        return
    gid = _group_id(group)  # its members must reach the socket through the directory
    if made:
        try:
            os.chown(directory, -1, gid)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.rmdir(directory)  # made for nothing: the next start makes it again
            raise StartupError(
                f"cannot give the socket's directory {directory} to group {group!r}: "
                f"{exc.strerror}; fix `socket_group` (a group the gateway's user is in)"
            ) from exc
        os.chmod(directory, 0o750)
    elif info.st_gid != gid or info.st_mode & 0o050 != 0o050:
        raise StartupError(
            f"the socket's directory {directory} exists, but group {group!r} cannot reach the "
            f"socket through it (group {info.st_gid}, mode {stat.S_IMODE(info.st_mode):o}): "
            f"`chgrp {group}` and `chmod g+rx` it, or remove it and the gateway makes it"
        )


def listen(path: str, group: str | None) -> socket.socket:
    """Bind the Unix socket (its directory was claimed by ``claim``)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
    except OSError as exc:
        listener.close()
        raise StartupError(
            f"cannot bind {path}: {exc.strerror or exc}; choose another `--socket`"
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
    listener.listen(LISTEN_BACKLOG)
    return listener


def _group_id(group: str) -> int:
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise StartupError(f"socket_group: no group named {group!r}; fix `socket_group`") from None
