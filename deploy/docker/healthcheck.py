#!/usr/bin/env python3
"""adp-healthcheck: the image's HEALTHCHECK, for whichever service its container runs.

- The gateway (``adp-gateway serve``): healthy while it answers ``adp-gateway status`` on its
  ``--socket`` (a round trip through its accept loop, which logs nothing) and says it is ready
  (recovered, not stopping). The container's user is the gateway's, whom status answers.
- The lmcache server: ``GET /healthcheck`` on its ``--http-host``/``--http-port``.
- Anything else (``adp-gateway check``, a one-off ``lmcache bench``): healthy.

Each service is found by its command line in /proc, so the check follows the flags the service
was really started with, with or without an init process as PID 1. Exit 0 healthy, 1 not; one
line of output, which ``docker inspect`` shows. Kubernetes can probe the gateway's /healthz and
/readyz instead, when it has a metrics address (deploy/k8s).
"""

from __future__ import annotations

import os
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from adp_gateway.errors import GatewayError
from adp_gateway.observe.status import ask

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


def gateway_ready(socket_path: str) -> tuple[bool, str]:
    try:
        ready = bool(ask(socket_path).get("ready"))
    except (GatewayError, OSError) as exc:
        return False, f"gateway {socket_path}: {exc}"
    return ready, f"gateway {socket_path} {'ready' if ready else 'answers, not ready'}"


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def check(argv: list[str]) -> tuple[bool, str] | None:
    """(healthy, what was checked) for a service's argv, or None if it is no service."""
    if runs(argv, "adp-gateway", "serve"):
        return gateway_ready(flag_value(argv, "--socket", os.environ.get("ADP_SOCKET", "")))
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
