"""Goal: `adp-gateway check` finds every damaged record and says which object it belongs to;
`--fix` makes the disk and the index a restart rebuilds agree again; it never runs beside a
gateway that uses the same databases."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from adp_gateway.__main__ import main
from tests.support.storage import extent, locations, make_devices, open_store, payload

SIZE = 4096 + 8 * 256 * 2**10


def fill(tmp_path: Path) -> dict[str, bytes]:
    store = open_store(make_devices("file", tmp_path, 1, SIZE))
    objects = {f"k{i}": payload(i, 30_000 + 70_000 * (i % 2)) for i in range(20)}
    for key, data in objects.items():
        store.put("t", key, extent(data), len(data))
    store.close()
    return objects


def test_a_clean_store_checks_clean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fill(tmp_path)
    assert main(["check", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr()
    assert "0 damaged" in out.out and "30 records" in out.out
    assert "20 complete objects" in out.out
    assert "checking: " in out.err  # progress


def test_a_damaged_payload_is_reported_then_fixed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    objects = fill(tmp_path)
    store = open_store(make_devices("file", tmp_path, 1, SIZE))
    victim = locations(store, "t", "k3")[0]
    store.close()
    with open(tmp_path / "db0.adp", "r+b") as f:
        f.seek(victim.offset + 4096 + 777)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert main(["check", "--data-dir", str(tmp_path)]) == 1
    report = capsys.readouterr().out
    assert re.search(r"t/k3 fragment 0 \(version \d+\): payload fails its checksum", report)
    assert main(["check", "--data-dir", str(tmp_path), "--fix"]) == 0
    assert main(["check", "--data-dir", str(tmp_path)]) == 0
    assert "0 damaged" in capsys.readouterr().out.splitlines()[-1]
    reopened = open_store(make_devices("file", tmp_path, 1, SIZE))
    assert reopened.exists("t", list(objects)) == [key != "k3" for key in objects]
    for key, data in objects.items():
        out = extent(bytes(len(data)))
        if key != "k3":
            assert reopened.get("t", key, out, len(data)) and bytes(out[: len(data)]) == data


def test_check_refuses_databases_in_use(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fill(tmp_path)
    store = open_store(make_devices("file", tmp_path, 1, SIZE))
    assert main(["check", "--data-dir", str(tmp_path)]) == 2
    assert "in use by another gateway" in capsys.readouterr().err
    store.close()


def test_check_of_a_missing_database_is_one_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", "--data-dir", str(tmp_path / "nothing")]) == 2
    assert "no database at" in capsys.readouterr().err
