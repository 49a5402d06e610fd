"""The image under test, built from this checkout by scripts/docker-offline.sh, the command
deploy/docker/README.md gives users, or the reason it cannot be.

It needs a Docker daemon and a base image: ``$ADP_DOCKER_BASE_IMAGE``, else the local image that
scripts/docker-base.sh makes (no registry needed; CI's scripts/docker-ci.sh makes it);
``python:3.11-slim-bookworm`` works where Docker Hub is reachable. The script downloads the
wheels on this host (kept in $ADP_DOCKER_CACHE) and builds with ``PIP_NO_INDEX=1``: no index is
reached from inside the build.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "lmcache-adp:test"
LOCAL_BASE = "lmcache-adp-base:bookworm"
BUILD_TIMEOUT_S = 1800


class Unavailable(Exception):
    """Docker cannot run the image here; the message says why and what would fix it."""


def docker(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout_s, check=False
    )


def check_daemon() -> None:
    """Raise Unavailable unless a Docker daemon answers."""
    why = os.environ.get("ADP_DOCKER_UNAVAILABLE")  # set by scripts/docker-ci.sh
    hint = f" ({why})" if why else " (start dockerd, or run CI's scripts/docker-ci.sh)"
    if shutil.which("docker") is None:
        raise Unavailable("no docker command on PATH" + hint)
    try:
        answer = docker("info", "--format", "{{.ServerVersion}}", timeout_s=30)
    except subprocess.TimeoutExpired:
        raise Unavailable("`docker info` did not answer within 30 s" + hint) from None
    if answer.returncode != 0:
        lines = answer.stderr.strip().splitlines() or ["no output"]
        raise Unavailable(f"no Docker daemon answers: {lines[-1]}" + hint)


def base_image() -> str:
    """The BASE_IMAGE build argument."""
    base = os.environ.get("ADP_DOCKER_BASE_IMAGE") or LOCAL_BASE
    if base == LOCAL_BASE and docker("image", "inspect", base).returncode != 0:
        raise Unavailable(
            f"no base image {base}: run scripts/docker-base.sh (root and debootstrap), or set "
            "ADP_DOCKER_BASE_IMAGE=python:3.11-slim-bookworm where Docker Hub is reachable"
        )
    return base


def build(log_path: Path) -> str:
    """Build the image from this checkout as a user would; the output goes to ``log_path``."""
    check_daemon()
    command = [str(ROOT / "scripts" / "docker-offline.sh"), "--base", base_image(), "--tag", IMAGE]
    with open(log_path, "w") as log:
        built = subprocess.run(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
    assert built.returncode == 0, f"{' '.join(command)} failed:\n{log_path.read_text()[-4000:]}"
    return IMAGE
