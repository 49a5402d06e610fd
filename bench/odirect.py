"""Does a directory take O_DIRECT? Checked at a benchmark's start on every directory a contender
stores in, because the answer changes what the figures mean.

A filesystem that refuses O_DIRECT (tmpfs before Linux 6.6, some overlays) answers the open with
EINVAL. The gateway then opens its databases buffered (adp_gateway/card/software/devices/
filedevice.py) and LMCache's fs_native falls back to buffered files too (its
``try_enable_odirect``), so "O_DIRECT" contenders there measure the page cache, not the drive.
The check opens a new file with O_DIRECT, writes one page-aligned 4 KiB page of random bytes and
reads it back the same way: a filesystem that accepts the flag but fails or garbles the I/O shows
too. The file is removed whatever happens.
"""

from __future__ import annotations

import errno
import mmap
import os
import secrets
from pathlib import Path
from typing import Any

from bench.machine import filesystem_type

PAGE_BYTES = 4096
WORKS, REFUSED, FAILED = "works", "refused", "failed"


def check(directory: Path) -> dict[str, Any]:
    """``{"dir", "filesystem", "odirect": works|refused|failed, "error"}`` for ``directory``
    (which must exist): ``refused`` when the kernel answers O_DIRECT with EINVAL, ``failed``
    for any other error or a page read back unlike the one written."""
    result: dict[str, Any] = {"dir": str(directory), "filesystem": filesystem_type(directory)}
    path = directory / f".adp-odirect-check-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        status, error = _write_then_read(path)
    finally:
        path.unlink(missing_ok=True)
    return {**result, "odirect": status, "error": error}


def _write_then_read(path: Path) -> tuple[str, str | None]:
    written, read = mmap.mmap(-1, PAGE_BYTES), mmap.mmap(-1, PAGE_BYTES)  # page aligned
    written.write(secrets.token_bytes(PAGE_BYTES))
    step = "open"
    try:
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_DIRECT
        fd = os.open(path, flags, 0o600)
        try:
            step = "write"
            moved = os.pwrite(fd, written, 0)
            step = "read"
            moved = min(moved, os.preadv(fd, [read], 0))
        finally:
            os.close(fd)
    except OSError as exc:
        status = REFUSED if exc.errno == errno.EINVAL else FAILED
        return status, f"{step}: {exc.strerror or exc} (errno {exc.errno})"
    if moved != PAGE_BYTES:
        return FAILED, f"moved {moved} of {PAGE_BYTES} bytes"
    if read[:] != written[:]:
        return FAILED, "the page read back is not the page written"
    return WORKS, None


def line(result: dict[str, Any]) -> str:
    """One sentence for a report's Markdown."""
    where = f"{result['dir']} ({result['filesystem']})"
    if result["odirect"] == WORKS:
        return f"O_DIRECT works on {where}."
    if result["odirect"] == REFUSED:
        return (
            f"O_DIRECT is refused on {where}: {result['error']}: the gateway falls back to "
            "buffered I/O there and fs-odirect writes buffered."
        )
    return f"O_DIRECT could not be checked on {where}: {result['error']}."


def works(results: list[dict[str, Any]], directory: Path) -> bool:
    """Whether ``directory``'s check (one of ``results``) found O_DIRECT working."""
    return any(r["dir"] == str(directory) and r["odirect"] == WORKS for r in results)
