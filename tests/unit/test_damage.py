"""Goal: damage costs only what it touched. A flipped byte in a region's first page (its start
record) loses no record that still verifies, whether the region's footer names them (sealed)
or a walk must find them (the region that was open at a crash); and `adp-gateway check`
reports every damaged structure, by object where the bytes were an object's, by region
otherwise, exits 1, and `--fix` leaves a disk that checks clean with nothing else lost."""

from __future__ import annotations

import logging
import mmap
from pathlib import Path

import pytest

from adp_gateway.__main__ import main
from adp_gateway.card.software.devices.memory import MemoryDevice
from adp_gateway.card.software.format import unpack_superblock
from adp_gateway.card.software.sealing import unpack_trailer
from adp_gateway.objects.store import ObjectStore
from adp_wire.ring.layout import PAGE_BYTES, align_up
from tests.support.storage import REGION, extent, locations, make_devices, open_store, payload

SIZE = PAGE_BYTES + 8 * REGION
OBJECTS = {f"k{i}": payload(i, 20_000 + 3_000 * i) for i in range(16)}  # over several regions


def fill(store: ObjectStore) -> None:
    for key, data in OBJECTS.items():
        store.put("t", key, extent(data), len(data))


def loaded(store: ObjectStore) -> dict[str, bool]:
    out = {}
    for key, data in OBJECTS.items():
        into = extent(bytes(len(data)))
        out[key] = store.get("t", key, into, len(data)) and bytes(into[: len(data)]) == data
    return out


def region_of(store: ObjectStore, key: str) -> int:
    return locations(store, "t", key)[0].region


def flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x01]))


def config(directory: Path) -> str:
    path = directory / "gateway.yaml"
    path.write_text(f"data_dirs: [{directory}]\nregion_size: {REGION}\nfragment_size: 64KiB\n")
    return str(path)


@pytest.fixture
def sealed(tmp_path: Path) -> dict[str, int]:
    """A database of objects, closed cleanly (every region sealed); key -> its region."""
    store = open_store(make_devices("file", tmp_path, 1, SIZE))
    fill(store)
    where = {key: region_of(store, key) for key in OBJECTS}
    store.close()
    return where


def check(directory: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    code = main(["check", "--config", config(directory), *extra])
    return code, capsys.readouterr().out


def test_a_damaged_start_record_of_a_sealed_region_loses_nothing(
    tmp_path: Path,
    sealed: dict[str, int],
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before, recovery took the region for a free one: its objects became misses without a
    word, and `check` said "0 damaged"."""
    region = sealed["k0"]
    assert list(sealed.values()).count(region) > 1
    flip(tmp_path / "db0.adp", PAGE_BYTES + region * REGION + 200)
    code, report = check(tmp_path, capsys)
    assert code == 1 and f"region {region}: its start record" in report, report
    caplog.set_level(logging.WARNING)
    store = open_store(make_devices("file", tmp_path, 1, SIZE))
    try:
        assert loaded(store) == dict.fromkeys(OBJECTS, True)
        assert f"region {region}: its start record is damaged" in caplog.text
    finally:
        store.close()
    assert check(tmp_path, capsys)[0] == 0  # the start record was rewritten


def test_a_damaged_start_record_of_the_region_open_at_a_crash_loses_nothing() -> None:
    """No footer (the gateway was killed while the region took records): the walk must find
    its records all the same."""
    device = MemoryDevice(SIZE)
    store = open_store([device])
    fill(store)
    open_region = region_of(store, "k15")  # the last object lies in the open region
    start = PAGE_BYTES + open_region * REGION
    page = memoryview(mmap.mmap(-1, PAGE_BYTES))
    device.read([page], start + REGION - PAGE_BYTES)
    assert not any(page), "the open region has no trailer yet"
    device.read([page], start)
    page[300] ^= 0x01
    device.write([page], start)
    reopened = open_store([device])  # the first store is never closed: a kill
    assert loaded(reopened) == dict.fromkeys(OBJECTS, True)


def structure(tmp_path: Path, sealed: dict[str, int], kind: str) -> tuple[int, str | None]:
    """The offset of a byte of a structure of ``kind`` in the database, and the object whose
    bytes those are (None: no object's)."""
    store = open_store(make_devices("file", tmp_path, 1, SIZE))
    try:
        at = locations(store, "t", "k5")[0]
    finally:
        store.close()
    region_start = PAGE_BYTES + at.region * REGION
    with open(tmp_path / "db0.adp", "rb") as f:
        superblock = unpack_superblock(f.read(PAGE_BYTES))
        assert superblock is not None
        f.seek(region_start + REGION - PAGE_BYTES)
        trailer = unpack_trailer(memoryview(f.read(PAGE_BYTES)), superblock.salt)
    assert trailer is not None
    footer_end = region_start + trailer.footer_offset + trailer.footer_bytes
    return {
        "header": (at.offset + 150, "k5"),
        "payload": (at.offset + PAGE_BYTES + 777, "k5"),
        "footer": (region_start + trailer.footer_offset + 10, None),
        "footer padding": (footer_end + (align_up(footer_end) - footer_end) // 2, None),
        "trailer": (region_start + REGION - PAGE_BYTES + 40, None),
    }[kind]


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        ("header", "t/k5 fragment 0 (version "),
        ("payload", "): payload fails its checksum"),
        ("footer", "its footer is damaged"),
        ("footer padding", "its footer's padding is damaged"),
        ("trailer", "its trailer (its last page) is damaged"),
    ],
)
def test_check_reports_each_kind_of_damage_where_it_lies_and_fix_loses_nothing_else(
    tmp_path: Path,
    sealed: dict[str, int],
    capsys: pytest.CaptureFixture[str],
    kind: str,
    says: str,
) -> None:
    offset, owner = structure(tmp_path, sealed, kind)
    flip(tmp_path / "db0.adp", offset)
    code, report = check(tmp_path, capsys)
    line = next((line for line in report.splitlines() if says in line), "")
    assert code == 1 and line, report
    assert kind != "header" or line.endswith("its header is damaged"), line
    assert check(tmp_path, capsys, "--fix")[0] == 0
    code, report = check(tmp_path, capsys)
    assert code == 0 and "0 damaged" in report, report
    store = open_store(make_devices("file", tmp_path, 1, SIZE))
    try:
        assert loaded(store) == {key: key != owner for key in OBJECTS}
    finally:
        store.close()


def test_a_damaged_last_record_of_the_region_open_at_a_crash_is_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No footer, and no later header to make a hole of it: the walk just ends early. `check`
    reports the page that looks like a header but fails its checksum (the suite found this)."""
    work = tmp_path / "work"
    work.mkdir()
    store = open_store(make_devices("file", work, 1, SIZE))
    fill(store)
    last = locations(store, "t", "k15")[-1]
    image = tmp_path / "killed"
    image.mkdir()
    (image / "db0.adp").write_bytes((work / "db0.adp").read_bytes())  # as a kill leaves it
    store.close()
    assert check(image, capsys)[0] == 0
    flip(image / "db0.adp", last.offset + 1000)
    code, report = check(image, capsys)
    assert code == 1 and "hold a damaged record header" in report, report
