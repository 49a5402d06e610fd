"""The gateway's start-up line on huge pages for session windows (adp_gateway/host/hugepages.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from adp_gateway.host.hugepages import describe, shmem_setting


@pytest.mark.parametrize(
    ("text", "setting"),
    [
        ("always within_size advise [never] deny force\n", "never"),
        ("always within_size [advise] never deny force\n", "advise"),
        ("[within_size] always\n", "within_size"),
        ("garbage without a choice\n", None),
    ],
)
def test_the_hosts_setting_is_the_bracketed_word(tmp_path: Path, text: str, setting: str) -> None:
    path = tmp_path / "shmem_enabled"
    path.write_text(text)
    assert shmem_setting(path) == setting


def test_a_host_without_the_setting_has_none(tmp_path: Path) -> None:
    assert shmem_setting(tmp_path / "missing") is None


@pytest.mark.parametrize("setting", ["advise", "within_size", "always", "force"])
def test_settings_that_grant_the_advice_say_so(setting: str) -> None:
    line = describe(setting)
    assert line.startswith("session windows in huge pages") and setting in line


@pytest.mark.parametrize("setting", ["never", "deny", None])
def test_otherwise_the_line_says_how_to_turn_them_on(setting: str | None) -> None:
    line = describe(setting)
    assert line.startswith("session windows in 4 KiB pages")
    assert "echo advise > /sys/kernel/mm/transparent_hugepage/shmem_enabled" in line
