#!/usr/bin/env python3
"""adp-healthcheck: the image's HEALTHCHECK, for whichever service its container runs.

- The gateway (``adp-gateway serve``): healthy while its ``--socket`` file is there and a socket
  bound at that path is listening, as the kernel lists it in /proc/net/unix. Reading that list
  opens no connection, so a check every 30 s leaves no "refused client" line in the gateway's
  log (a bare connect and close would), and it needs nothing the gateway does not have yet.
- The lmcache server: ``GET /healthcheck`` on its ``--http-host``/``--http-port``.
- Anything else (``adp-gateway check``, a one-off ``lmcache bench``): healthy.

Each service is found by its command line in /proc, so the check follows the flags the service
was really started with, with or without an init process as PID 1. Exit 0 healthy, 1 not; one
line of output, which ``docker inspect`` shows.

Once the gateway has ``adp-gateway status`` and a metrics port with ``/healthz``, the gateway's
check becomes one of those (deploy/k8s/README.md).
"""

from __future__ import annotations

import os
import stat
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ACCEPTING_FLAG = 0x10000  # __SO_ACCEPTCON: the socket is listening
HTTP_TIMEOUT_S = 5.0


def command_lines(proc: Path = Path("/proc")) -> Iterator[list[str]]:
    """The argv of every process this check can see (those that end meanwhile are skipped)."""
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if raw:
            yield raw.rstrip(b"\0").decode(errors="replace").split("\0")


def flag_value(argv: list[str], name: str, default: str) -> str:
    """The last value given for ``name`` (``--name V`` or ``--name=V``), as argparse takes it."""
    value = default
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


def runs(argv: list[str], program: str, command: str) -> bool:
    """Whether ``argv`` is ``program command ...``, started directly or through its interpreter."""
    for i, arg in enumerate(argv[:2]):
        if os.path.basename(arg) == program:
            return command in argv[i + 1 : i + 2]
    return False


def listening(socket_path: str, table: Path = Path("/proc/net/unix")) -> bool:
    """Whether a Unix socket bound at ``socket_path`` is listening and still reachable there
    (the kernel goes on listing a listener whose file was removed)."""
    try:
        if not stat.S_ISSOCK(os.stat(socket_path).st_mode):
            return False
    except OSError:
        return False
    for line in table.read_text().splitlines()[1:]:
        fields = line.split(None, 7)
        if len(fields) == 8 and fields[7] == socket_path and int(fields[3], 16) & ACCEPTING_FLAG:
            return True
    return False


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def check(argv: list[str]) -> tuple[bool, str] | None:
    """(healthy, what was checked) for a service's argv, or None if it is no service."""
    if runs(argv, "adp-gateway", "serve"):
        path = flag_value(argv, "--socket", os.environ.get("ADP_SOCKET", ""))
        return listening(path), f"gateway socket {path} listening"
    if runs(argv, "lmcache", "server"):
        host = flag_value(argv, "--http-host", "127.0.0.1")
        host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        url = f"http://{host}:{flag_value(argv, '--http-port', '8080')}/healthcheck"
        return http_ok(url), f"lmcache server {url}"
    return None


def main() -> int:
    results = [r for r in map(check, command_lines()) if r is not None]
    if not results:
        print("adp-healthcheck: no gateway or lmcache server in this container: nothing to check")
        return 0
    for healthy, what in results:
        print(f"adp-healthcheck: {'ok' if healthy else 'FAILED'}: {what}")
    return 0 if all(healthy for healthy, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
