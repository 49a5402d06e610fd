"""Goal: a start the gateway refuses leaves the disk as it found it (files it created removed,
files it grew shrunk back, directories it made gone), so the retry is not refused because of
what the refused start left; and free space is counted once per filesystem, so two data dirs
on one drive are not promised its space twice."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from adp_gateway import config as gateway_config
from adp_gateway import service
from adp_gateway.config import GatewayConfig
from adp_gateway.errors import StartupError, StorageError
from adp_gateway.objects.store import ObjectStore
from tests.support import BIN, ROOT, Gateway


def run_gateway(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "adp-gateway"), "serve", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def write_config(path: Path, text: str) -> Path:
    path.write_text(text + "\n")
    return path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_two_data_dirs_on_one_filesystem_share_its_free_space(tmp_path: Path) -> None:
    """Before, the free space was added once per data dir: a capacity of 1.5 times what the
    drive holds passed the check, and the second preallocation failed half way."""
    free = shutil.disk_usage(tmp_path).free
    config = gateway_config.load(
        None,
        {"data_dirs": [str(tmp_path / "a"), str(tmp_path / "b")], "capacity": free * 3 // 2},
    )
    with pytest.raises(StartupError, match=r"a, .*b can take only .* \(one filesystem\)"):
        gateway_config.resolve_capacity(config)
    assert not list((tmp_path / "a").iterdir()) and not list((tmp_path / "b").iterdir())


def test_a_start_refused_at_a_later_database_removes_what_it_made(workdir: Path) -> None:
    """Database 1 was formatted with another region size, so the start is refused after
    database 0 was created, preallocated and formatted: that file and its directory go, and
    database 1's file is shrunk back to its size, its bytes untouched."""
    tmp_path = workdir  # short enough for a socket path
    old = tmp_path / "old"
    first = Gateway(tmp_path, "16MiB", data_dir=old)
    first_config = write_config(tmp_path / "first.yaml", "region_size: 1MiB\nfragment_size: 256KiB")
    first.args += ["--config", str(first_config)]
    first.start()
    assert first.stop() == 0
    config = tmp_path / "gateway.yaml"
    new = tmp_path / "new" / "deeper"
    config.write_text(
        textwrap.dedent(f"""\
            data_dirs: [{new}, {old}]
            region_size: 2MiB
            fragment_size: 256KiB
            capacity: 64MiB
            socket: {tmp_path / "s2.sock"}
        """)
    )
    before = digest(old / "db0.adp"), (old / "db0.adp").stat().st_size
    result = run_gateway("--config", str(config))
    assert result.returncode == 2, result.stderr
    assert "was formatted with region_size" in result.stderr
    assert not (tmp_path / "new").exists()
    assert (digest(old / "db0.adp"), (old / "db0.adp").stat().st_size) == before
    assert not (tmp_path / "s2.sock").exists()


def test_a_failed_preallocation_takes_back_its_file(tmp_path: Path) -> None:
    """posix_fallocate failing (here: past RLIMIT_FSIZE) leaves no new file behind, and an
    existing file at its old size: a half-reserved file would keep its space."""
    script = textwrap.dedent(f"""\
        import os, resource, signal, sys
        sys.path.insert(0, {str(ROOT)!r})
        from adp_gateway.card.software.devices.filedevice import FileDevice
        from adp_gateway.errors import StartupError
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4 * 2**20, resource.RLIM_INFINITY))
        for name in ("new.adp", "grown.adp"):
            try:
                FileDevice(os.path.join({str(tmp_path)!r}, name), 8 * 2**20)
            except StartupError as exc:
                print("refused:", exc)
    """)
    grown = tmp_path / "grown.adp"
    grown.write_bytes(b"x" * 2**20)
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.stdout.count("refused: cannot reserve 8.0 MiB") == 2, result
    assert not (tmp_path / "new.adp").exists()
    assert grown.read_bytes() == b"x" * 2**20


def test_a_socket_that_cannot_be_bound_takes_back_the_databases(workdir: Path) -> None:
    """The last step of a start, binding the socket, fails for a path too long for a Unix
    socket: the database files made and formatted before it go too."""
    socket_path = workdir / "sockets" / ("s" * 120)
    result = run_gateway(
        "--data-dir", str(workdir / "data"), "--socket", str(socket_path), "--capacity", "256MiB"
    )
    assert result.returncode == 2 and "cannot bind" in result.stderr, result.stderr
    assert not (workdir / "data").exists() and not (workdir / "sockets").exists()


def test_a_symbolic_link_in_place_of_a_database_is_refused_and_its_target_untouched(
    workdir: Path,
) -> None:
    """It leads to a file that is not the gateway's: never grown, never shrunk back."""
    data = workdir / "data"
    data.mkdir()
    target = workdir / "someones.bin"
    target.write_bytes(b"x" * 10_000)
    (data / "db0.adp").symlink_to(target)
    result = run_gateway(
        "--data-dir", str(data), "--socket", str(workdir / "s.sock"), "--capacity", "256MiB"
    )
    assert result.returncode == 2 and "db0.adp is a symbolic link" in result.stderr
    assert target.read_bytes() == b"x" * 10_000


def test_a_directory_in_place_of_a_database_is_one_clear_error(workdir: Path) -> None:
    data = workdir / "data"
    (data / "db0.adp").mkdir(parents=True)
    result = run_gateway(
        "--data-dir", str(data), "--socket", str(workdir / "s.sock"), "--capacity", "256MiB"
    )
    assert result.returncode == 2 and "cannot open the database" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_start_its_recovery_refuses_closes_the_databases(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recovery that raises (a drive failing the sync after stale versions are deleted)
    refuses the start and closes the databases it opened, the preparer it started too: the
    next start in the same process is not refused as "in use by another gateway"."""
    config = GatewayConfig(
        data_dirs=[str(workdir / "data")],
        capacity="64MiB",
        region_size="8MiB",
        socket=str(workdir / "gateway.sock"),
        metrics_address=None,
    )
    service.Gateway(config).stop()  # the databases now exist: a refused start keeps them
    recover = ObjectStore.recover

    def recover_then_fail(store: ObjectStore) -> int:
        recover(store)
        raise StorageError("the sync after deleting stale versions failed")

    monkeypatch.setattr(ObjectStore, "recover", recover_then_fail)
    with pytest.raises(StorageError, match="stale versions"):
        service.Gateway(config)
    monkeypatch.undo()
    gateway = service.Gateway(config)
    gateway.stop()
    assert not [t for t in threading.enumerate() if t.name.startswith("prepare")]
