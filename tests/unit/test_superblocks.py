"""Goal: the superblock survives one bad copy, and a database that holds data is never formatted
without an operator's `adp-gateway format --force`. A flipped byte in the superblock loses
nothing (its copy in every region's start record rebuilds it, and `check` reports it); a
database with no readable superblock that holds anything (in its first MiB, where others'
labels lie, or where a format writes) is refused with one line naming `check`, its bytes
untouched; only one that holds nothing is formatted by the gateway."""

from __future__ import annotations

import hashlib
import logging
import subprocess
from pathlib import Path

import pytest

from adp_gateway.__main__ import main
from adp_gateway.card.software.format import unpack_superblock
from adp_gateway.card.software.superblocks import region_starts
from adp_gateway.errors import StartupError
from adp_wire.ring.layout import PAGE_BYTES
from tests.support import BIN
from tests.support.storage import REGION, extent, make_devices, open_store, payload

SIZE = PAGE_BYTES + 8 * REGION


def fill(directory: Path) -> dict[str, bytes]:
    """A database of eight regions, objects in several of them, closed cleanly."""
    store = open_store(make_devices("file", directory, 1, SIZE))
    objects = {f"k{i}": payload(i, 20_000 + 5_000 * i) for i in range(12)}
    for key, data in objects.items():
        store.put("t", key, extent(data), len(data))
    store.close()
    return objects


def flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x5A]))


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def config(directory: Path) -> str:
    path = directory / "gateway.yaml"
    path.write_text(f"data_dirs: [{directory}]\nregion_size: {REGION}\nfragment_size: 64KiB\n")
    return str(path)


def loads(directory: Path, objects: dict[str, bytes]) -> list[bool]:
    """Open the database as the gateway does (recovery included); which objects load."""
    store = open_store(make_devices("file", directory, 1, SIZE))
    try:
        out = []
        for key, data in objects.items():
            into = extent(bytes(len(data)))
            out.append(store.get("t", key, into, len(data)) and bytes(into[: len(data)]) == data)
        return out
    finally:
        store.close()


def refused(directory: Path, match: str) -> None:
    """Opening the database as the gateway does is refused with ``match``."""
    devices = make_devices("file", directory, 1, SIZE)
    try:
        with pytest.raises(StartupError, match=match):
            open_store(devices)
    finally:
        devices[0].close()


@pytest.mark.parametrize("offset", [0, 9, 16, 1000, 4000, 4090])
def test_a_flipped_byte_in_the_superblock_loses_nothing(
    tmp_path: Path,
    offset: int,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before, one flipped byte (even in its padding) made `check` exit 2 ("not a formatted
    database") and the next start format the database: every object lost."""
    objects = fill(tmp_path)
    database = tmp_path / "db0.adp"
    flip(database, offset)
    assert main(["check", "--config", config(tmp_path)]) == 1
    assert "its superblock is damaged" in capsys.readouterr().out
    caplog.set_level(logging.WARNING)
    assert loads(tmp_path, objects) == [True] * len(objects)
    assert "restored from the copy in region" in caplog.text
    assert main(["check", "--config", config(tmp_path)]) == 0  # rewritten at that start


def test_check_fix_rewrites_a_damaged_superblock(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fill(tmp_path)
    flip(tmp_path / "db0.adp", 2048)
    assert main(["check", "--config", config(tmp_path), "--fix"]) == 0
    assert main(["check", "--config", config(tmp_path)]) == 0
    assert "0 damaged" in capsys.readouterr().out.splitlines()[-1]


def test_a_database_that_holds_data_but_no_readable_superblock_is_never_formatted(
    tmp_path: Path,
) -> None:
    """Its superblock and every copy damaged: the gateway refuses with one line naming
    `check` and touches no byte; `adp-gateway format --force` is the operator's way out."""
    objects = fill(tmp_path)
    database = tmp_path / "db0.adp"
    devices = make_devices("file", tmp_path, 1, SIZE)
    starts = region_starts(devices[0], REGION)
    devices[0].close()
    flip(database, 100)
    for start in starts:
        flip(database, start + 3000)  # each start record fails its checksum: no copy holds
    before = digest(database)
    refused(tmp_path, r"not empty, so the gateway will not format it")
    result = subprocess.run(
        [
            str(BIN / "adp-gateway"),
            "serve",
            "--config",
            config(tmp_path),
            "--socket",
            str(tmp_path / "s.sock"),
            "--capacity",
            str(SIZE),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = [line for line in result.stderr.splitlines() if line.startswith("adp-gateway:")]
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "run `adp-gateway check`" in lines[0] and "format --force" in lines[0]
    assert digest(database) == before
    assert main(["format", "--config", config(tmp_path), "--force"]) == 0
    assert loads(tmp_path, objects) == [False] * len(objects)  # emptied, on purpose


def test_a_foreign_device_is_refused_untouched(tmp_path: Path) -> None:
    """A file or device of other bytes where a database is expected (a swapped device name)
    is not formatted over."""
    database = tmp_path / "db0.adp"
    database.write_bytes(payload(7, SIZE))
    before = digest(database)
    refused(tmp_path, r"adp-gateway check")
    assert digest(database) == before


@pytest.mark.parametrize(
    "label_at",
    [64 * 2**10, 2**20 - 100, PAGE_BYTES + 3 * REGION - 8],
    ids=["btrfs-label-at-64KiB", "end-of-first-MiB", "a-region-last-page"],
)
def test_a_device_of_zeros_but_a_label_where_a_format_writes_is_refused_untouched(
    tmp_path: Path, label_at: int
) -> None:
    """Zeros on page 0 and at every region's start do not make a device blank: a filesystem's
    or RAID's label in its first MiB, or bytes in a region's last page (which a format zeroes),
    are someone's."""
    database = tmp_path / "db0.adp"
    with open(database, "wb") as f:
        f.truncate(SIZE)
        f.seek(label_at)
        f.write(b"_BHRfS_M")
    before = digest(database)
    refused(tmp_path, r"not empty, so the gateway will not format it")
    assert digest(database) == before


def test_an_empty_database_is_formatted_and_one_holding_nothing_too(tmp_path: Path) -> None:
    """All zeros (new), or a damaged superblock of ours before any region was used: nothing
    to lose, so the gateway formats it by itself."""
    open_store(make_devices("file", tmp_path, 1, SIZE)).close()  # new: formatted
    flip(tmp_path / "db0.adp", 3000)  # no region used yet: no copy, nothing held either
    open_store(make_devices("file", tmp_path, 1, SIZE)).close()
    with open(tmp_path / "db0.adp", "rb") as f:
        assert unpack_superblock(f.read(PAGE_BYTES)) is not None
