"""Goal: data of another on-disk format version is never half read: the gateway refuses it with
one line naming the fix, and touches none of its bytes; `adp-gateway format` empties only the
databases that hold nothing unless given --force, never beside a running gateway, and a
formatted database serves again."""

from __future__ import annotations

import hashlib
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from adp_gateway.__main__ import main
from adp_gateway.card.software.format import FORMAT_VERSION
from adp_wire.checksum import checksum
from adp_wire.ring.layout import PAGE_BYTES
from tests.support import BIN, Gateway

SUPERBLOCK = struct.Struct("<8sHHIQQ")  # docs/on-disk-format.md


def set_version(path: Path, version: int) -> None:
    """Rewrite the superblock of the database at ``path`` as one of format ``version``, its
    checksum intact (what an older release wrote)."""
    with open(path, "r+b") as f:
        page = bytearray(f.read(PAGE_BYTES))
        magic, _, database, reserved, region_bytes, salt = SUPERBLOCK.unpack_from(page)
        SUPERBLOCK.pack_into(page, 0, magic, version, database, reserved, region_bytes, salt)
        page[PAGE_BYTES - 8 :] = struct.pack("<Q", checksum(bytes(page[: PAGE_BYTES - 8])))
        f.seek(0)
        f.write(page)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def serve(gateway: Gateway) -> subprocess.CompletedProcess[str]:
    """``adp-gateway serve`` as ``gateway`` would run it, expected to refuse to start."""
    return subprocess.run(
        [str(BIN / "adp-gateway"), "serve", *gateway.args],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def stored(make_gateway: Callable[..., Gateway]) -> Gateway:
    """A stopped gateway whose database was written (and sealed) by this release."""
    gateway = make_gateway("256MiB").start()
    assert gateway.stop() == 0
    return gateway


def test_a_database_of_an_older_format_is_refused_with_the_fix_and_left_alone(
    stored: Gateway,
) -> None:
    database = stored.data_dir / "db0.adp"
    set_version(database, FORMAT_VERSION - 1)
    before = digest(database)
    result = serve(stored)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("adp-gateway:")]
    assert len(lines) == 1
    assert f"holds format version {FORMAT_VERSION - 1}" in lines[0]
    assert f"reads version {FORMAT_VERSION}" in lines[0]
    assert "adp-gateway format --force" in lines[0]
    assert digest(database) == before


def test_format_empties_only_with_force_and_the_gateway_then_serves(
    stored: Gateway, capsys: pytest.CaptureFixture[str]
) -> None:
    database = stored.data_dir / "db0.adp"
    set_version(database, FORMAT_VERSION - 1)
    before = digest(database)
    assert main(["format", "--data-dir", str(stored.data_dir)]) == 1
    assert "not formatted" in capsys.readouterr().out and digest(database) == before
    assert main(["format", "--data-dir", str(stored.data_dir), "--force"]) == 0
    assert "formatted" in capsys.readouterr().out
    stored.start()
    assert stored.alive
    assert main(["format", "--data-dir", str(stored.data_dir), "--force"]) == 2  # in use
    assert "in use by another gateway" in capsys.readouterr().err


def test_format_of_new_databases_needs_no_force(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A database file that holds nothing yet (all zeros) is formatted without --force."""
    data = workdir / "data"
    data.mkdir()
    (data / "db0.adp").write_bytes(bytes(PAGE_BYTES + 2 * 64 * 2**20))
    assert main(["format", "--data-dir", str(data)]) == 0
    assert "formatted, 2 regions of 64.0 MiB, empty" in capsys.readouterr().out


def test_format_without_force_leaves_a_file_with_others_labels_where_it_writes(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Zeros at page 0 and every region's start, but a label at 64 KiB (a btrfs's) and its
    copy at 64 MiB, a region's last page, which a format zeroes: someone's, as serve says."""
    data = workdir / "data"
    data.mkdir()
    database = data / "db0.adp"
    with open(database, "wb") as f:
        f.truncate(PAGE_BYTES + 2 * 64 * 2**20)
        for offset in (64 * 2**10, 64 * 2**20):
            f.seek(offset)
            f.write(b"_BHRfS_M")
    before = digest(database)
    assert main(["format", "--data-dir", str(data)]) == 1
    assert "bytes where a format writes" in capsys.readouterr().out
    assert digest(database) == before


@pytest.mark.parametrize("command", ["format", "check"])
def test_a_database_file_too_small_to_be_one_is_one_clear_error(
    workdir: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """What a first start killed between creating the file and growing it leaves."""
    data = workdir / "data"
    data.mkdir()
    (data / "db0.adp").write_bytes(bytes(100))
    assert main([command, "--data-dir", str(data)]) == 2
    assert "holds 100 bytes, too few for a database" in capsys.readouterr().err
