"""Goal: the benchmarks' O_DIRECT check (bench/odirect.py) tells a directory that takes O_DIRECT
from one that refuses it and from one it could not check, says which in a sentence the reports
print, and leaves no file behind."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from bench import odirect


def kernel_takes_odirect(directory: Path) -> bool:
    """The kernel's own answer, asked without the module under test."""
    path = directory / "oracle"
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600))
    except OSError as exc:
        assert exc.errno == errno.EINVAL, exc
        return False
    finally:
        path.unlink(missing_ok=True)
    return True


def test_a_directory_is_checked_with_a_page_written_and_read_back(tmp_path: Path) -> None:
    result = odirect.check(tmp_path)
    expected = odirect.WORKS if kernel_takes_odirect(tmp_path) else odirect.REFUSED
    assert result["odirect"] == expected, result
    assert result["dir"] == str(tmp_path)
    assert result["filesystem"] not in ("", "?")
    assert list(tmp_path.iterdir()) == [], "the check left its file behind"
    if expected == odirect.WORKS:
        assert result["error"] is None
        assert odirect.line(result) == f"O_DIRECT works on {tmp_path} ({result['filesystem']})."
        assert odirect.works([result], tmp_path)


def test_a_filesystem_that_refuses_o_direct_is_named_with_what_follows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = os.open

    def open_like_old_tmpfs(path: Any, flags: int, mode: int = 0o777) -> int:
        fd = real_open(path, flags & ~os.O_DIRECT, mode)  # the file appears, as on old tmpfs
        if flags & os.O_DIRECT:
            os.close(fd)
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return fd

    monkeypatch.setattr(os, "open", open_like_old_tmpfs)
    result = odirect.check(tmp_path)
    assert result["odirect"] == odirect.REFUSED
    assert result["error"].startswith("open: Invalid argument")
    assert "falls back to buffered I/O there and fs-odirect writes buffered" in odirect.line(result)
    assert not odirect.works([result], tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_page_read_back_unlike_the_one_written_fails_the_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "preadv", lambda fd, buffers, offset: odirect.PAGE_BYTES)
    if not kernel_takes_odirect(tmp_path):
        pytest.skip(f"{tmp_path} refuses O_DIRECT: no page to read back")
    result = odirect.check(tmp_path)
    assert result["odirect"] == odirect.FAILED
    assert result["error"] == "the page read back is not the page written"


def test_a_missing_directory_is_reported_not_raised(tmp_path: Path) -> None:
    result = odirect.check(tmp_path / "missing")
    assert result["odirect"] == odirect.FAILED
    assert "No such file or directory" in result["error"]
    assert odirect.line(result).startswith(f"O_DIRECT could not be checked on {tmp_path}/missing")
