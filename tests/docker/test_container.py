"""Goal: the image runs the stack as documented. The gateway container, as its non-root user,
keeps its data in a host directory and serves its socket in a host directory shared with other
containers and the host; what LMCache's own harness stores there, from a second container and
from the host, loads back (byte-verified) in new processes after the gateway container restarts;
the socket's uid/gid rule admits the image's user and members of its group and no one else; the
gateway serves /healthz, /readyz and /metrics when given a metrics address; `docker exec ...
adp-gateway status` finds the gateway's socket by the image's $ADP_SOCKET; all of it confined
as deploy/k8s runs it (read-only root, no capabilities, no network). The HEALTHCHECK tells a
serving gateway (`adp-gateway status`, ready) and a serving lmcache server (the image's second
entry point, with the plugin connected to the gateway) from a starting one, and fails once the
gateway's socket is gone.

Skipped, with the reason, where no Docker daemon answers or no base image is there
(tests/support/docker_image.py; CI starts both with scripts/docker-ci.sh).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import remove_tree, short_tmpdir, wait_until
from tests.support.docker_image import ROOT, Unavailable, build, docker

pytestmark = pytest.mark.docker

UID = GID = 10001  # the image's adp user and lmcache group (Dockerfile)
# As deploy/k8s runs them: no network (the socket needs none), a read-only root file system
# with a tmpfs at /tmp, no capabilities, no privilege escalation.
CONFINED = (
    "--network", "none", "--read-only", "--tmpfs", "/tmp", "--cap-drop", "ALL",
    "--security-opt", "no-new-privileges",
)  # fmt: skip
OTHER_UID = 10002  # a user the image does not know
METRICS = "127.0.0.1:9464"  # inside the gateway container (its network is none)
SOCKET_IN_CONTAINER = "/run/lmcache-adp/gateway.sock"
BENCH_ARGS = (
    "--l1-align-bytes", "4096", "--data-size-kb", "1024", "--num-keys", "8",
    "--lookup-max-hit-rate", "1",
)  # fmt: skip


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    try:
        return build(tmp_path_factory.mktemp("docker") / "build.log")
    except Unavailable as exc:
        pytest.skip(str(exc))


class Dirs:
    """Host directories mounted into the containers: data, socket, outputs."""

    def __init__(self, root: Path) -> None:
        self.data, self.socket, self.out = root / "data", root / "sock", root / "out"
        for path in (self.data, self.socket, self.out):
            path.mkdir()
        self.out.chmod(0o777)  # written by containers of several users
        if os.geteuid() == 0:
            # As the image sets its own: the data dir the gateway's alone; the socket dir
            # writable by the gateway alone, searchable by (and setgid to) the socket's group.
            for path in (self.data, self.socket):
                os.chown(path, UID, GID)
            self.data.chmod(0o700)
            self.socket.chmod(0o2750)

    @property
    def socket_path(self) -> Path:
        return self.socket / "gateway.sock"

    def mounts(self, socket_mode: str = "ro") -> list[str]:
        """Clients mount the socket dir read-only: enough to connect."""
        return ["-v", f"{self.socket}:/run/lmcache-adp:{socket_mode}", "-v", f"{self.out}:/out"]


def run_as() -> list[str]:
    """Containers run as the image's user where the test can give it the directories (root);
    otherwise as the user running the test, who owns them."""
    return [] if os.geteuid() == 0 else ["--user", f"{os.geteuid()}:{os.getegid()}"]


class Containers:
    """Starts containers of the image with unique names and removes them all at the end."""

    def __init__(self, image: str, dirs: Dirs) -> None:
        self.image, self.dirs = image, dirs
        self.names: list[str] = []

    def start(
        self, *args: str, socket_mode: str = "ro", env: tuple[str, ...] = (),
        health_interval_s: int = 1,
    ) -> str:  # fmt: skip
        """A detached container running ``args`` (the entrypoint's), health-checked every
        second (the image's default is 30 s) so that waits stay short."""
        name = f"adp-test-{os.getpid()}-{len(self.names)}"
        self.names.append(name)
        flags = [*CONFINED, f"--health-interval={health_interval_s}s", *run_as()]
        flags += [f"--env={variable}" for variable in env]
        mounts = ["-v", f"{self.dirs.data}:/var/lib/lmcache-adp", *self.dirs.mounts(socket_mode)]
        started = docker("run", "--detach", "--name", name, *flags, *mounts, self.image, *args)
        assert started.returncode == 0, started.stderr
        return name

    def run(self, *args: str, user: list[str] | None = None) -> subprocess.CompletedProcess[str]:
        """A one-off container running ``args``, sharing the socket and output dirs."""
        flags = ["--rm", *CONFINED, *(run_as() if user is None else user)]
        return docker("run", *flags, *self.dirs.mounts(), self.image, *args, timeout_s=600)

    def remove_all(self) -> None:
        for name in self.names:
            docker("rm", "--force", "--volumes", name)


@pytest.fixture
def dirs() -> Iterator[Dirs]:
    root = short_tmpdir()  # the host's path to the socket must fit in 108 bytes
    yield Dirs(root)
    if os.geteuid() == 0:
        remove_tree(root)
    else:  # files the gateway made as another user: let a container remove them
        subprocess.run(["rm", "-rf", str(root)], check=False)


@pytest.fixture
def containers(image: str, dirs: Dirs) -> Iterator[Containers]:
    made = Containers(image, dirs)
    yield made
    made.remove_all()


def state(name: str) -> dict[str, object]:
    inspected = docker("inspect", "--format", "{{json .State}}", name)
    assert inspected.returncode == 0, inspected.stderr
    result: dict[str, object] = json.loads(inspected.stdout)
    return result


def logs(name: str) -> str:
    return docker("logs", name).stderr + docker("logs", name).stdout


def wait_healthy(name: str, timeout_s: float = 180) -> None:
    """Wait until the HEALTHCHECK reports healthy; fail at once if the container stops."""

    def healthy() -> bool:
        current = state(name)
        assert current["Running"], f"{name} stopped:\n{logs(name)[-4000:]}"
        health = current.get("Health")
        return isinstance(health, dict) and health.get("Status") == "healthy"

    wait_until(healthy, timeout_s, f"{name} to be healthy")


def start_gateway(containers: Containers) -> str:
    name = containers.start(
        "gateway", "--capacity", "1GiB", socket_mode="rw", env=(f"ADP_METRICS_ADDRESS={METRICS}",)
    )
    wait_healthy(name)
    return name


def l2_adapter(socket_path: str | Path) -> str:
    """The --l2-adapter JSON for a client of the gateway container, whichever its uid."""
    # The plugin trusts a gateway of root or its own uid by default; the gateway and its socket
    # dir are uid 10001's, and the host's client and OTHER_UID are other users.
    params = {"socket_path": str(socket_path), "op_timeout_s": 10.0, "gateway_uids": [UID]}
    return json.dumps(
        {
            "type": "native_plugin",
            "module_path": "lmcache_adp",
            "class_name": "ADPConnector",
            "adapter_params": params,
            "max_capacity_gb": 0,
        }
    )


def bench(
    containers: Containers, output: str, *args: str, user: list[str] | None = None
) -> dict[str, dict[str, float]]:
    """`lmcache bench l2` in a new container through the shared socket: its ops by name."""
    ran = containers.run(
        "lmcache", "bench", "l2", "--l2-adapter", l2_adapter(SOCKET_IN_CONTAINER),
        "--format", "json", "--output", f"/out/{output}", *BENCH_ARGS, *args,
        user=user,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    metrics = json.loads((containers.dirs.out / output).read_text())["metrics"]
    return {m["operation"]: m for key, m in metrics.items() if key.startswith("op_")}


def roundtrip_from_host(dirs: Dirs, action: str, seed: int) -> int:
    """The repository's byte-exact store/verify tool, run on the host through the socket."""
    done = subprocess.run(
        [
            sys.executable, "-m", "tests.support.l2_roundtrip", action,
            l2_adapter(dirs.socket_path), "4", str(3 * 2**20 + 7), str(seed),
        ],
        capture_output=True, text=True, timeout=300, cwd=ROOT, check=False,
    )  # fmt: skip
    print(done.stdout[-2000:], done.stderr[-2000:])
    return done.returncode


def recovered_objects(gateway_log: str) -> int:
    counts = re.findall(r"recovered (\d+) objects", gateway_log)
    assert counts, f"no recovery line in the gateway's log:\n{gateway_log[-3000:]}"
    return int(counts[-1])


def test_keys_stored_through_the_shared_socket_load_after_the_gateway_container_restarts(
    containers: Containers, dirs: Dirs
) -> None:
    gateway = start_gateway(containers)
    if os.geteuid() == 0:
        info = dirs.socket_path.stat()
        assert (info.st_uid, info.st_gid, info.st_mode & 0o7777) == (UID, GID, 0o660)
    # As deploy/docker/README.md says: status finds the socket in the image's $ADP_SOCKET.
    status = docker("exec", gateway, "adp-gateway", "status")
    assert status.returncode == 0, status.stdout + status.stderr
    assert f"gateway on {SOCKET_IN_CONTAINER}: ready" in status.stdout, status.stdout

    # A second container, as the image's user: store, look up and load, every byte verified.
    first = bench(containers, "first.json", "--no-skip-verify")
    for op in ("Store", "Lookup", "Load"):
        assert first[op]["total_success"] == first[op]["total_keys"] > 0, first[op]
    assert roundtrip_from_host(dirs, "store", seed=7) == 0  # the host, through the same socket

    # -t: Docker 23 and later call it --timeout, earlier ones --time.
    restarted = docker("restart", "-t", "60", gateway, timeout_s=120)
    assert restarted.returncode == 0, restarted.stderr
    wait_healthy(gateway)
    assert "gateway stopped" in logs(gateway)  # STOPSIGNAL reached it: a clean stop
    assert recovered_objects(logs(gateway)) >= first["Store"]["total_keys"] + 4

    # New processes: a container as another user in the socket's group, and the host.
    member = ["--user", f"{OTHER_UID}:{OTHER_UID}", "--group-add", str(GID)]
    again = bench(containers, "again.json", "--only", "load", user=member)["Load"]
    assert again["total_success"] == again["total_keys"] == first["Load"]["total_keys"], again
    assert roundtrip_from_host(dirs, "verify", seed=7) == 0
    assert roundtrip_from_host(dirs, "verify", seed=8) == 1  # never stored: the check can fail


def connect_as(containers: Containers, user: list[str]) -> subprocess.CompletedProcess[str]:
    probe = f"import socket; socket.socket(socket.AF_UNIX).connect({SOCKET_IN_CONTAINER!r})"
    return containers.run("python3", "-c", probe, user=user)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the directories to uid 10001")
def test_the_socket_admits_the_image_user_and_its_group_only(containers: Containers) -> None:
    gateway = start_gateway(containers)
    assert connect_as(containers, []).returncode == 0
    member = connect_as(containers, ["--user", f"{OTHER_UID}:{OTHER_UID}", "--group-add", str(GID)])
    assert member.returncode == 0, member.stderr
    stranger = connect_as(containers, ["--user", f"{OTHER_UID}:{OTHER_UID}"])
    assert stranger.returncode != 0 and "PermissionError" in stranger.stderr, stranger.stderr

    # ADP_METRICS_ADDRESS reached the gateway: what Kubernetes probes and Prometheus scrapes.
    for path in ("/readyz", "/healthz", "/metrics"):
        fetch = f"import urllib.request as u; u.urlopen('http://{METRICS}{path}', timeout=5)"
        fetched = docker("exec", gateway, "python3", "-c", fetch)
        assert fetched.returncode == 0, f"{path}: {fetched.stderr}"
    healthy = docker("exec", gateway, "adp-healthcheck")
    assert f"ok: gateway {SOCKET_IN_CONTAINER} ready" in healthy.stdout, healthy.stdout

    # The HEALTHCHECK fails once clients cannot reach the gateway any more.
    assert docker("exec", gateway, "rm", SOCKET_IN_CONTAINER).returncode == 0
    check = docker("exec", gateway, "adp-healthcheck")
    assert check.returncode == 1 and "FAILED" in check.stdout, check.stdout


def test_the_lmcache_server_entry_point_connects_its_plugin_and_reports_healthy(
    containers: Containers,
) -> None:
    gateway = start_gateway(containers)
    connected_before = logs(gateway).count(" connected")
    server = containers.start("lmcache-server", "--l1-size-gb", "1")
    wait_healthy(server)
    check = docker("exec", server, "adp-healthcheck")
    assert check.returncode == 0, check.stdout + check.stderr
    assert "ok: lmcache server http://127.0.0.1:8080/healthcheck" in check.stdout, check.stdout
    # Docker's own 64 MiB /dev/shm cannot hold a 1 GiB L1: it stays private, and the log says so.
    assert "too little for a 1 GiB L1" in logs(server), logs(server)[-2000:]
    wait_until(
        lambda: logs(gateway).count(" connected") > connected_before,
        60,
        "the plugin in the lmcache server container to connect to the gateway",
    )
