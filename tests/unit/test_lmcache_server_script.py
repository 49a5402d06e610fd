"""Goal: configs/lmcache-server.sh puts LMCache's L1 in shared memory (zero-copy stores) wherever
/dev/shm can hold it, keeps it private with one line saying how to get room where it cannot, and
keeps it private without a word when told --private-l1.

The script ends by exec'ing `lmcache server`; here an `lmcache` first on PATH prints the arguments
it was given instead, so what is checked is the launcher's own choice of flags (the real server
with these flags: tests/integration/test_serve_script.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support import ROOT

SHM_FLAGS = ["--shm-name", "adp-6123", "--no-l1-use-lazy"]


def launch(tmp_path: Path, *flags: str, shm_dir: Path | None = None) -> tuple[list[str], str]:
    """The `lmcache` arguments the script chose, and what it said on stderr."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "lmcache"
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    fake.chmod(0o755)
    done = subprocess.run(
        [str(ROOT / "configs" / "lmcache-server.sh"), "--port", "6123", *flags],
        capture_output=True,
        text=True,
        timeout=30,
        env={
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            **({"ADP_SHM_DIR": str(shm_dir)} if shm_dir else {}),
        },
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines(), done.stderr


def contains(argv: list[str], run: list[str]) -> bool:
    return any(argv[i : i + len(run)] == run for i in range(len(argv)))


def test_l1_goes_to_shared_memory_where_it_fits(tmp_path: Path) -> None:
    argv, said = launch(tmp_path, "--l1-size-gb", "0.01")
    assert contains(argv, SHM_FLAGS) and contains(argv, ["--l1-size-gb", "0.01"])
    assert said == ""


def test_l1_stays_private_with_one_line_where_shared_memory_is_too_small(tmp_path: Path) -> None:
    argv, said = launch(tmp_path, "--l1-size-gb", "100000")  # no /dev/shm holds 100 TB
    assert "--shm-name" not in argv and contains(argv, ["--l1-size-gb", "100000"])
    assert len(said.splitlines()) == 1
    assert "too little for a 100000 GiB L1" in said and "--shm-size" in said


def test_private_l1_is_kept_private_without_a_word(tmp_path: Path) -> None:
    argv, said = launch(tmp_path, "--l1-size-gb", "0.01", "--private-l1")
    assert "--shm-name" not in argv and "--private-l1" not in argv
    assert said == ""


def test_the_room_a_stale_segment_of_this_port_holds_counts_as_free(tmp_path: Path) -> None:
    """A server killed without cleaning up leaves its segment behind; the next one on the port
    reuses it, so its bytes are room for L1, not room taken."""
    shm = tmp_path / "shm"
    shm.mkdir()
    with open(shm / "lmcache_l1_pool_adp-6123", "wb") as stale:
        stale.write(b"\1" * 64 * 2**20)  # written, so it takes room
    free = int(subprocess.check_output(["df", "--output=avail", "-B1", str(shm)]).split()[-1])
    gib = f"{(free + 32 * 2**20) / 2**30:.9f}"  # fits only if the stale 64 MiB are counted
    argv, said = launch(tmp_path, "--l1-size-gb", gib, shm_dir=shm)
    assert contains(argv, SHM_FLAGS), said
    other_port = launch(tmp_path, "--l1-size-gb", gib, "--port", "6124", shm_dir=shm)
    assert "--shm-name" not in other_port[0]  # another port's segment is not this server's
