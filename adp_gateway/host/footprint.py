"""What a start of the gateway adds to the filesystem, so that a refused start takes it back.

A start creates directories (data dirs, the socket's directory), creates or grows database
files (preallocated: they hold their space) and binds its socket. When the start is refused
after that (a later database cannot be reserved, was formatted with another region size, the
socket cannot be bound...), what it made would hold disk space and make the retry fail: a
smaller capacity would be refused because of the files a bigger one left. So ``Footprint``
notes, before the start touches anything, which of those paths exist and how large each
database file is, and ``undo`` removes what was not there and shrinks what was grown back to
its old size. It never touches a path that existed before, beyond that shrink, nor one that
is no longer the kind of file it made.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from pathlib import Path

from adp_gateway.config import GatewayConfig

log = logging.getLogger(__name__)


class Footprint:
    def __init__(self, config: GatewayConfig) -> None:
        """Note what exists now, before the start creates anything."""
        files = config.database_paths[: len(config.database_paths) - len(config.devices)]
        self._file_sizes = {path: _size_of(path) for path in files}
        directories = [*config.data_dirs, os.path.dirname(os.path.abspath(config.socket_path))]
        self._new_directories = [d for path in directories for d in _missing_chain(path)]

    def undo(self) -> None:
        """Take back what the start made: new database files removed, grown ones shrunk back
        to their size before it, new (and now empty) directories removed."""
        for path, size in self._file_sizes.items():
            with contextlib.suppress(OSError):
                info = os.lstat(path)
                if not stat.S_ISREG(info.st_mode):
                    continue
                if size is None:
                    os.unlink(path)
                    log.info("removed %s, made by this refused start", path)
                elif info.st_size > size:
                    os.truncate(path, size)
                    log.info("shrank %s back to its size before this refused start", path)
        for directory in sorted(set(self._new_directories), key=len, reverse=True):
            with contextlib.suppress(OSError):
                os.rmdir(directory)  # only when empty: nothing of anyone else's goes


def _size_of(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def _missing_chain(directory: str) -> list[str]:
    """``directory`` and those of its parents that do not exist yet (a start makes them)."""
    missing = []
    path = Path(os.path.abspath(directory))
    while not path.exists() and path != path.parent:
        missing.append(str(path))
        path = path.parent
    return missing
