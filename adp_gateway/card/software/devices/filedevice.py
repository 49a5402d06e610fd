"""A database on a preallocated file or a raw block device, with O_DIRECT I/O.

O_DIRECT keeps KV bytes out of the page cache (they are already cached in LMCache's L1) and costs
3-5 % of a core per GB/s against a whole core for buffered I/O. Where the filesystem refuses
O_DIRECT (tmpfs, some overlays) the file is opened buffered and that is logged.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import stat
import struct

from adp_gateway.errors import StartupError
from adp_wire.ring.layout import PAGE_BYTES
from adp_wire.trace import Stage, mark
from adp_wire.units import format_size

log = logging.getLogger(__name__)


class FileDevice:
    """``grow``: create or grow a regular file to ``size_bytes`` (a data dir's database).
    Without it (a `devices:` entry: a block device, or a file standing for one) the path must
    exist and hold ``size_bytes`` already."""

    def __init__(self, path: str, size_bytes: int, grow: bool = True) -> None:
        self.path = path
        try:
            if grow and not (os.path.exists(path) and stat.S_ISBLK(os.stat(path).st_mode)):
                _preallocate(path, size_bytes)
            elif not os.path.exists(path):
                raise StartupError(f"device {path} does not exist: check `devices`")
            self._fd, self.direct = _open(path)
        except OSError as exc:  # a directory in its place, say
            raise StartupError(
                f"cannot open the database {path}: {exc.strerror or exc}; it must be a regular "
                "file the gateway made, or a block device: check `data_dirs` and `devices`"
            ) from exc
        self._size_bytes = size_bytes
        try:  # one gateway (or `adp-gateway check`) per database; released when the fd closes
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            raise StartupError(
                f"{path} is in use by another gateway or `adp-gateway check`: stop it first"
            ) from None
        device_bytes = os.lseek(self._fd, 0, os.SEEK_END)
        if device_bytes < size_bytes:
            os.close(self._fd)
            raise StartupError(
                f"{path} holds {format_size(device_bytes)}, less than the "
                f"{format_size(size_bytes)} asked for: lower `capacity`"
            )

    @property
    def size_bytes(self) -> int:
        return self._size_bytes

    def write(self, buffers: list[memoryview], offset: int) -> None:
        total = sum(len(b) for b in buffers)
        assert offset + total <= self._size_bytes
        mark(Stage.DEVICE_START, total)
        done = os.pwritev(self._fd, buffers, offset)
        mark(Stage.DEVICE_END, total)
        if done != total:  # short write: finish it buffer by buffer
            _finish(self._fd, buffers, offset, done, os.pwritev)

    def read(self, buffers: list[memoryview], offset: int) -> None:
        total = sum(len(b) for b in buffers)
        mark(Stage.DEVICE_START, total)
        done = os.preadv(self._fd, buffers, offset)
        mark(Stage.DEVICE_END, total)
        if done != total:
            _finish(self._fd, buffers, offset, done, os.preadv)

    def sync(self) -> None:
        os.fdatasync(self._fd)

    def close(self) -> None:
        os.close(self._fd)

    def unwritten_ranges(self) -> list[tuple[int, int]]:
        """(offset, length) of the file's blocks never written (holes, and the unwritten extents
        posix_fallocate leaves), from the filesystem's extent map (FIEMAP); none for a block
        device, or where the filesystem cannot tell."""
        if not stat.S_ISREG(os.fstat(self._fd).st_mode):
            return []
        try:
            return _unwritten(self._fd, self._size_bytes)
        except OSError as exc:
            log.debug("%s: no extent map (%s); treating every block as written", self.path, exc)
            return []


def open_existing(path: str) -> FileDevice:
    """The database at ``path`` as it is (its own size, nothing grown), locked: for the tools
    that run while the gateway is stopped (check, format)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise StartupError(f"no database at {path}: {exc.strerror}") from exc
    if stat.S_ISBLK(mode):
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.lseek(fd, 0, os.SEEK_END)
        finally:
            os.close(fd)
    else:
        size = os.path.getsize(path)
    if size < PAGE_BYTES:  # a first start cut short between creating the file and growing it
        raise StartupError(
            f"{path} holds {size} bytes, too few for a database: not one of the gateway's, or "
            "one whose first start was cut short (then remove it: `serve` makes it again)"
        )
    return FileDevice(path, size, grow=False)


def _finish(fd: int, buffers: list[memoryview], offset: int, done: int, call: object) -> None:
    position = offset
    for buf in buffers:
        if done >= len(buf):
            done -= len(buf)
            position += len(buf)
            continue
        view = buf[done:]
        position += done
        done = 0
        while len(view):
            moved = call(fd, [view], position)  # type: ignore[operator]
            if moved <= 0:
                raise OSError(errno.EIO, "device returned no bytes (end of device?)")
            view = view[moved:]
            position += moved


def _open(path: str) -> tuple[int, bool]:
    flags = os.O_RDWR | os.O_CLOEXEC
    try:
        return os.open(path, flags | os.O_DIRECT), True
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
    log.warning("%s refuses O_DIRECT; using buffered I/O (slower, uses the page cache)", path)
    return os.open(path, flags), False


def _preallocate(path: str, size_bytes: int) -> None:
    """Create or grow the database file to ``size_bytes``, reserving the blocks now. When that
    fails, the file is removed (if this call made it) or shrunk back to its old size: a
    half-reserved file would keep the space and fail the next start too."""
    created = not os.path.lexists(path)
    # O_EXCL: a file that appeared meanwhile is someone else's, never removed below.
    # O_NOFOLLOW: a symbolic link in the data dir leads to a file that is not the gateway's,
    # which it must not grow (nor shrink back on failure: its undo follows no link either).
    flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags | (os.O_CREAT | os.O_EXCL if created else 0), 0o600)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise StartupError(
            f"{path} is a symbolic link: a database in a data dir is a file the gateway makes "
            "there; remove the link, or list a block device under `devices`"
        ) from exc
    old_bytes = os.fstat(fd).st_size
    try:
        if old_bytes < size_bytes:
            os.posix_fallocate(fd, 0, size_bytes)
    except OSError as exc:
        with contextlib.suppress(OSError):
            if created:
                os.unlink(path)
            else:
                os.ftruncate(fd, old_bytes)  # gives back the blocks reserved past it
        raise StartupError(
            f"cannot reserve {format_size(size_bytes)} in {path}: "
            f"{exc.strerror}; lower `capacity` or free space"
        ) from exc
    finally:
        os.close(fd)


_FS_IOC_FIEMAP = 0xC020660B
_FIEMAP = struct.Struct("=QQIIII")  # start, length, flags, mapped extents, extent count, reserved
_EXTENT = struct.Struct("=QQQQQIIII")  # logical, physical, length, 2 reserved, flags, 3 reserved
_EXTENT_LAST, _EXTENT_UNWRITTEN = 0x1, 0x800
_EXTENTS_PER_CALL = 256


def _unwritten(fd: int, size_bytes: int) -> list[tuple[int, int]]:
    """Holes and unwritten extents of ``fd`` within ``size_bytes``, merged, in order."""
    found: list[tuple[int, int]] = []

    def add(start: int, end: int) -> None:
        end = min(end, size_bytes)
        if start >= end:
            return
        if found and found[-1][0] + found[-1][1] == start:
            found[-1] = (found[-1][0], end - found[-1][0])
        else:
            found.append((start, end - start))

    written_to = 0  # everything below is accounted for
    while written_to < size_bytes:
        request = bytearray(_FIEMAP.size + _EXTENT.size * _EXTENTS_PER_CALL)
        _FIEMAP.pack_into(
            request, 0, written_to, size_bytes - written_to, 0, 0, _EXTENTS_PER_CALL, 0
        )
        fcntl.ioctl(fd, _FS_IOC_FIEMAP, request, True)
        mapped = _FIEMAP.unpack_from(request)[3]
        if not mapped:
            break
        last = False
        for i in range(mapped):
            logical, _, length, _, _, flags, *_ = _EXTENT.unpack_from(
                request, _FIEMAP.size + i * _EXTENT.size
            )
            add(written_to, logical)  # a hole before this extent
            if flags & _EXTENT_UNWRITTEN:
                add(max(logical, written_to), logical + length)
            written_to = max(written_to, logical + length)
            last = bool(flags & _EXTENT_LAST)
        if last:
            break
    add(written_to, size_bytes)  # a hole at the end
    return found
