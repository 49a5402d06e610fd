"""The image under test, built from this checkout, or the reason it cannot be.

It needs a Docker daemon, a base image and the wheels:
- the base: ``$ADP_DOCKER_BASE_IMAGE``, else the local image that scripts/docker-base.sh makes
  (no registry needed); ``python:3.11-slim-bookworm`` works where Docker Hub is reachable;
- the wheels: deploy/docker/wheels/ is filled with the CPU torch wheel the host's pip holds
  locally and ``pip download`` of the project's dependencies (kept in $ADP_DOCKER_CACHE), and
  the image is built with ``PIP_NO_INDEX=1``: no index is reached from inside the build.
  Without a local CPU torch wheel the build uses the Dockerfile's defaults (PyPI and PyTorch's
  CPU index).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
WHEELS = ROOT / "deploy" / "docker" / "wheels"
IMAGE = "lmcache-adp:test"
LOCAL_BASE = "lmcache-adp-base:bookworm"
BUILD_TIMEOUT_S = 1800
PIP_TIMEOUT_S = 900
MARKER_PASSES_MAX = 5


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


def dockerfile_arg(name: str) -> str:
    """The default of the Dockerfile's ``ARG name=...``, so versions live in one place."""
    found = re.search(rf"^ARG {name}=(\S+)$", DOCKERFILE.read_text(), re.MULTILINE)
    assert found is not None, f"the Dockerfile has no ARG {name}=..."
    return found.group(1)


def pip_download(dest: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(dest), *args],
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT_S,
        check=False,
    )


def python_version(base: str) -> str:
    """The base image's Python (x.y.z): dependencies' markers may depend on its patch level."""
    ran = docker("run", "--rm", "--network", "none", base, "python3", "-c",
                 "import platform; print(platform.python_version())")  # fmt: skip
    assert ran.returncode == 0, f"no python3 in the base image {base}: {ran.stderr}"
    return ran.stdout.strip()


def fill_wheels(python: str) -> bool:
    """Put in deploy/docker/wheels/ every wheel the build needs, for the base image's ``python``;
    False when this host has no CPU torch wheel of its own (then the build reaches the indexes
    itself). The wheels are downloaded once into $ADP_DOCKER_CACHE (as scripts/docker-base.sh's
    tarball) and linked from there, so a new checkout on the same machine, as CI's, reuses them
    and the build's layers."""
    torch = f"torch=={dockerfile_arg('TORCH_VERSION')}"
    constraints = [torch, f"lmcache=={dockerfile_arg('LMCACHE_VERSION')}"]
    with open(ROOT / "pyproject.toml", "rb") as f:
        requirements: list[str] = tomllib.load(f)["project"]["dependencies"]
    key = "\n".join([python, *constraints, *requirements])
    store = cache_dir() / f"wheels-{hashlib.sha1(key.encode()).hexdigest()[:12]}"
    if not (store / ".complete").exists():
        for old in cache_dir().glob("wheels-*"):
            shutil.rmtree(old)
        store.mkdir(parents=True)
        if not download_wheels(store, python, constraints, requirements):
            return False
        (store / ".complete").touch()
    for stale in WHEELS.glob("*.whl"):
        if not (store / stale.name).exists():
            stale.unlink()
    for wheel in store.glob("*.whl"):
        if not (WHEELS / wheel.name).exists():
            try:
                os.link(wheel, WHEELS / wheel.name)
            except OSError:  # another file system
                shutil.copyfile(wheel, WHEELS / wheel.name)
    return True


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "lmcache-adp" / "docker"
    return Path(os.environ.get("ADP_DOCKER_CACHE") or default)


def download_wheels(
    store: Path, python: str, constraints: list[str], requirements: list[str]
) -> bool:
    # torch only from what the host's pip holds on local disk (its find-links): never CUDA.
    if pip_download(store, "--no-index", "--no-deps", constraints[0]).returncode != 0:
        return False
    if not any("+cpu" in wheel.name for wheel in store.glob("torch-*.whl")):
        return False
    constraint_file = store / "constraints.txt"
    constraint_file.write_text("\n".join(constraints) + "\n")
    target = ["--python-version", python, "--only-binary", ":all:", "--constraint"]
    for _ in range(MARKER_PASSES_MAX):
        fetched = pip_download(store, *target, str(constraint_file), *requirements)
        assert fetched.returncode == 0, f"pip download failed:\n{fetched.stderr[-3000:]}"
        requirements = missing_requirements(store, python)
        if not requirements:
            return True
    raise AssertionError(f"wheels still missing for Python {python}: {requirements}")


def missing_requirements(store: Path, python: str) -> list[str]:
    """Dependencies of the wheels here that the base image's ``python`` needs and none of them
    provides. pip evaluates markers against the Python running it, even with --python-version,
    so a host on 3.11.7 skips what 3.11.2 needs (redis wants async-timeout below 3.11.3)."""
    environment = {key: str(value) for key, value in default_environment().items()}
    environment["extra"] = ""
    environment.update(python_full_version=python, python_version=".".join(python.split(".")[:2]))
    wheels = list(store.glob("*.whl"))
    have = {parse_wheel_filename(wheel.name)[0] for wheel in wheels}
    missing: set[str] = set()
    for wheel in wheels:
        for requirement in requires(wheel):
            if requirement.marker is not None and not requirement.marker.evaluate(environment):
                continue
            if canonicalize_name(requirement.name) not in have:
                requirement.marker = None
                missing.add(str(requirement))
    return sorted(missing)


def requires(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(name).decode().splitlines()
    prefix = "Requires-Dist:"
    return [Requirement(line[len(prefix) :].strip()) for line in lines if line.startswith(prefix)]


def build(log_path: Path) -> str:
    """Build the image from this checkout; its output goes to ``log_path``."""
    check_daemon()
    base = base_image()
    args = ["build", "--tag", IMAGE, "--build-arg", f"BASE_IMAGE={base}"]
    if fill_wheels(python_version(base)):
        args += ["--build-arg", "PIP_NO_INDEX=1"]
    with open(log_path, "w") as log:
        built = subprocess.run(
            ["docker", *args, str(ROOT)],
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
    assert built.returncode == 0, f"docker build failed:\n{log_path.read_text()[-4000:]}"
    return IMAGE
