"""What a benchmark's numbers depend on: the code, the CPUs and their load, the filesystem."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

CHECKOUT = Path(__file__).resolve().parents[1]


def machine(directory: Path) -> dict[str, Any]:
    """What the numbers depend on: the code, the CPUs and how busy they were, the filesystem."""
    return {
        "commit": commit_of_checkout(),
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
        "dir_filesystem": _filesystem(directory),
    }


def commit_of_checkout() -> str:
    """The commit the benchmark runs, marked when the checkout has uncommitted changes."""
    # A copy of the tree without its .git (the GPU host's) names its commit in ADP_COMMIT.
    commit = os.environ.get("ADP_COMMIT") or _git("rev-parse", "--short", "HEAD")
    if not os.environ.get("ADP_COMMIT") and _git("status", "--porcelain", "--untracked-files=no"):
        commit += " (with uncommitted changes)"
    return commit


def _git(*args: str) -> str:
    """Git in the checkout this code runs from, wherever the bench was started."""
    try:
        done = subprocess.run(
            ["git", *args], cwd=CHECKOUT, capture_output=True, text=True, timeout=30
        )
    except OSError:
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def _filesystem(directory: Path) -> str:
    """``device on mountpoint type fstype`` of the mount holding ``directory``."""
    mountpoint, device, fstype = _mount(directory)
    return f"{device} on {mountpoint} type {fstype}"


def filesystem_type(directory: Path) -> str:
    """The type of the filesystem holding ``directory`` (``tmpfs``, ``ext4``; ``stat -f``'s)."""
    return _mount(directory)[2]


def _mount(directory: Path) -> tuple[str, str, str]:
    """(mountpoint, device, fstype) of the innermost mount holding ``directory``."""
    path = str(directory.resolve())
    best = ("", "?", "?")
    with open("/proc/mounts") as mounts:
        for line in mounts:
            device, mountpoint, fstype = line.split()[:3]
            inside = path == mountpoint or path.startswith(mountpoint.rstrip("/") + "/")
            if inside and len(mountpoint) >= len(best[0]):
                best = (mountpoint, device, fstype)
    return best
