"""Download every wheel the Dockerfile installs, for the base image's own Python, into a cache
directory, and link them into deploy/docker/wheels/ (run by scripts/docker-offline.sh).

    python3 deploy/docker/fetch_wheels.py PYTHON_VERSION GLIBC_VERSION MACHINE

The wheels: the CPU build of torch at the Dockerfile's TORCH_VERSION (from a wheel the host's
pip already holds on local disk, else from TORCH_INDEX_URL, PyTorch's CPU index), then
pyproject.toml's dependencies, held at the Dockerfile's TORCH_VERSION and LMCACHE_VERSION, with
all they depend on, for that Python, glibc and machine. pip evaluates environment markers
against the Python running it even when told another version, so a host on 3.11.7 leaves out
what the image's 3.11.2 needs (redis wants async-timeout below 3.11.3); the wheels' own
requirements are read back and whatever the image's Python needs and no wheel provides is
downloaded too, until nothing is missing.

The cache is $ADP_DOCKER_CACHE (default ~/.cache/lmcache-adp/docker), one directory per set of
inputs, so a second build, or another checkout on the same machine, downloads nothing. Needs
Python 3.11+ (tomllib) and pip; `packaging` from pip's own copy where it is not installed.
Exit 1 with one line saying what failed.
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

try:
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name, parse_wheel_filename
except ImportError:  # a bare system Python: pip carries its own copy
    from pip._vendor.packaging.markers import default_environment  # type: ignore[no-redef]
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]
    from pip._vendor.packaging.utils import (  # type: ignore[no-redef]
        canonicalize_name,
        parse_wheel_filename,
    )

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
WHEELS = ROOT / "deploy" / "docker" / "wheels"
PIP_TIMEOUT_S = 900
MARKER_PASSES_MAX = 5


class FetchError(Exception):
    """A download failed; the message says which and why."""


def dockerfile_arg(name: str) -> str:
    """The default of the Dockerfile's ``ARG name=...``, so versions live in one place."""
    found = re.search(rf"^ARG {name}=(\S+)$", DOCKERFILE.read_text(), re.MULTILINE)
    if found is None:
        raise FetchError(f"the Dockerfile has no ARG {name}=...")
    return found.group(1)


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "lmcache-adp" / "docker"
    return Path(os.environ.get("ADP_DOCKER_CACHE") or default)


def pip_download(dest: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(dest), *args],
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT_S,
        check=False,
    )


def last_lines(text: str, count: int = 5) -> str:
    return " | ".join(text.strip().splitlines()[-count:]) or "no output"


def fetch(python: str, glibc: str, machine: str) -> Path:
    """The cache directory holding every wheel, downloading what it lacks."""
    torch = f"torch=={dockerfile_arg('TORCH_VERSION')}"
    constraints = [torch, f"lmcache=={dockerfile_arg('LMCACHE_VERSION')}"]
    with open(ROOT / "pyproject.toml", "rb") as f:
        requirements: list[str] = tomllib.load(f)["project"]["dependencies"]
    torch_index = os.environ.get("TORCH_INDEX_URL") or dockerfile_arg("TORCH_INDEX_URL")
    key = "\n".join([python, glibc, machine, torch_index, *constraints, *requirements])
    store = cache_dir() / f"wheels-{hashlib.sha1(key.encode()).hexdigest()[:12]}"
    if (store / ".complete").exists():
        return store
    for old in cache_dir().glob("wheels-*"):  # an older set of inputs: its wheels go
        shutil.rmtree(old)
    store.mkdir(parents=True)
    target = ["--only-binary", ":all:", "--python-version", python]
    for platform in manylinux_platforms(glibc, machine):
        target += ["--platform", platform]
    fetch_torch(store, torch, torch_index, target)
    constraint_file = store / "constraints.txt"
    constraint_file.write_text("\n".join(constraints) + "\n")
    # The CPU torch wheel already here satisfies torch==X for what depends on it.
    target += ["--find-links", str(store), "--constraint", str(constraint_file)]
    for _ in range(MARKER_PASSES_MAX):
        fetched = pip_download(store, *target, *requirements)
        if fetched.returncode != 0:
            raise FetchError(f"pip download {' '.join(requirements)}: {last_lines(fetched.stderr)}")
        requirements = missing_requirements(store, python)
        if not requirements:
            (store / ".complete").touch()
            return store
    raise FetchError(f"wheels still missing for Python {python}: {requirements}")


def manylinux_platforms(glibc: str, machine: str) -> list[str]:
    """Every manylinux tag a wheel may carry and still load on this glibc (pip before 24 takes
    ``--platform manylinux_2_N`` as that tag alone, not "glibc 2.N or older")."""
    major, minor = (int(part) for part in glibc.split(".")[:2])
    if major != 2:
        raise FetchError(f"glibc {glibc}: only glibc 2.x is known")
    tags = [f"manylinux_2_{n}_{machine}" for n in range(minor, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    return tags + [f"{name}_{machine}" for n, name in legacy.items() if n <= minor]


def fetch_torch(store: Path, torch: str, index: str, target: list[str]) -> None:
    """The CPU build of torch: PyPI's default Linux torch is a CUDA build of several GB."""
    local = pip_download(store, "--no-index", "--no-deps", *target, torch)
    if local.returncode != 0 or not cpu_torch(store):
        for wheel in store.glob("torch-*.whl"):
            wheel.unlink()
        remote = pip_download(store, "--no-deps", "--index-url", index, *target, torch)
        if remote.returncode != 0:
            raise FetchError(
                f"no CPU wheel of {torch} on this host, and {index} did not give one "
                f"({last_lines(remote.stderr, 2)}): set TORCH_INDEX_URL to a reachable CPU "
                "index, or put the wheel where this host's pip finds it (pip config's find-links)"
            )
    if not cpu_torch(store):
        raise FetchError(f"the torch wheel from {index} is not a CPU build: set TORCH_INDEX_URL")


def cpu_torch(store: Path) -> bool:
    return any("+cpu" in wheel.name for wheel in store.glob("torch-*.whl"))


def missing_requirements(store: Path, python: str) -> list[str]:
    """Dependencies of the wheels in ``store`` that ``python`` needs and none of them provides."""
    environment = {key: str(value) for key, value in default_environment().items()}
    environment.update(
        extra="", python_full_version=python, python_version=".".join(python.split(".")[:2])
    )
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


def link_into_build_context(store: Path) -> int:
    """Make deploy/docker/wheels/ hold exactly the wheels of ``store``; their number."""
    WHEELS.mkdir(exist_ok=True)
    wanted = {wheel.name for wheel in store.glob("*.whl")}
    for stale in WHEELS.glob("*.whl"):
        if stale.name not in wanted:
            stale.unlink()
    for name in wanted:
        if not (WHEELS / name).exists():
            try:
                os.link(store / name, WHEELS / name)
            except OSError:  # another file system
                shutil.copyfile(store / name, WHEELS / name)
    return len(wanted)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    python, glibc, machine = argv
    try:
        store = fetch(python, glibc, machine)
    except (FetchError, subprocess.TimeoutExpired) as exc:
        print(f"fetch_wheels: {exc}", file=sys.stderr)
        return 1
    count = link_into_build_context(store)
    size = sum(wheel.stat().st_size for wheel in store.glob("*.whl"))
    print(f"fetch_wheels: {count} wheels ({size / 2**30:.1f} GiB) for Python {python} in {WHEELS}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
