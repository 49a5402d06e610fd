"""Goal: one gateway serves several tenants safely. Through real plugins and a real gateway
process: tenants cannot read, find or delete each other's objects under identical keys, nor
evict them by flooding, across a restart; a client not admitted as its tenant is refused with
one clear line on each side; the socket is group-only and the kernel's uid/gid decide; and
through a real `lmcache server`, other tenants and other cache_salts miss."""

from __future__ import annotations

import logging
import os
import socket
import stat
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from adp_wire.protocol import Hello, hello_body, recv_frame, send_frame
from lmcache_adp import ADPConnector
from tests.support import Gateway, LMCacheServer, run_mp_client, wait_for_future, wait_until
from tests.support.plugin import connected

pytestmark = pytest.mark.integration
OBJECT_BYTES = 256 * 2**10
NOBODY = 65534  # uid of `nobody` and gid of `nogroup` on Debian


def write_config(workdir: Path, extra: str = "") -> Path:
    token = workdir / "bob.token"
    token.write_text("bob-secret\n")
    token.chmod(0o600)
    path = workdir / "gateway.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            region_size: 1MiB
            fragment_size: 256KiB
            tenants:
              - {{name: alice, uids: [{os.getuid()}], quota: 8MiB}}
              - {{name: bob, uids: [{os.getuid()}], token_file: {token}, quota: 8MiB}}
              - {{name: carol, gids: [{NOBODY}]}}
              - {{name: mallory, uids: [4242]}}
            """
        )
        + extra
    )
    return path


@pytest.fixture
def tenant_gateway(workdir: Path, make_gateway: Callable[..., Gateway]) -> Gateway:
    return make_gateway("64MiB", "--config", str(write_config(workdir))).start()


class Client:
    """A real plugin connected as one tenant."""

    def __init__(self, gateway: Gateway, tenant: str, **params: object) -> None:
        self.connector = ADPConnector(
            **gateway.adapter_params(tenant=tenant, op_timeout_s=5.0, **params)
        )

    def store(self, objects: dict[str, bytes]) -> bool:
        views = [memoryview(bytearray(v)) for v in objects.values()]
        return bool(
            wait_for_future(self.connector, self.connector.submit_batch_set(list(objects), views))[
                1
            ]
        )

    def load(self, keys: list[str]) -> list[bytes | None]:
        out = [bytearray(OBJECT_BYTES) for _ in keys]
        item = wait_for_future(
            self.connector, self.connector.submit_batch_get(keys, [memoryview(b) for b in out])
        )
        return [bytes(b) if hit else None for b, hit in zip(out, item[3], strict=True)]

    def exists(self, keys: list[str]) -> list[bool]:
        return list(wait_for_future(self.connector, self.connector.submit_batch_exists(keys))[3])

    def delete(self, keys: list[str]) -> None:
        wait_for_future(self.connector, self.connector.submit_batch_delete(keys))

    def close(self) -> None:
        self.connector.close()


def objects(seed: int, count: int, prefix: str = "m@00000000@0@") -> dict[str, bytes]:
    rng = np.random.default_rng(seed)
    return {
        f"{prefix}{i:064x}": rng.integers(0, 256, OBJECT_BYTES, dtype=np.uint8).tobytes()
        for i in range(count)
    }


def test_tenants_cannot_read_find_or_delete_each_others_objects(tenant_gateway: Gateway) -> None:
    alice = Client(tenant_gateway, "alice")
    bob = Client(
        tenant_gateway, "bob", token_file=str(tenant_gateway.log_path.parent / "bob.token")
    )
    try:
        connected(alice.connector)
        connected(bob.connector)
        alices, bobs = objects(1, 6), objects(2, 6)  # the same six keys
        assert list(alices) == list(bobs)
        assert alice.store(alices) and bob.store(dict(list(bobs.items())[:3]))
        keys = list(alices)
        assert bob.exists(keys) == [True] * 3 + [False] * 3
        assert bob.load(keys) == [*list(bobs.values())[:3], None, None, None]
        bob.delete(keys)
        assert alice.load(keys) == list(alices.values())
        assert bob.exists(keys) == [False] * 6
    finally:
        alice.close()
        bob.close()


def test_a_tenant_flooding_its_quota_does_not_evict_another_across_a_restart(
    tenant_gateway: Gateway,
) -> None:
    bob_params = {"token_file": str(tenant_gateway.log_path.parent / "bob.token")}
    bob = Client(tenant_gateway, "bob", **bob_params)
    alice = Client(tenant_gateway, "alice")
    kept = objects(3, 12)
    try:
        connected(bob.connector)
        connected(alice.connector)
        assert bob.store(kept)
        for batch in range(8):  # 4x alice's 8 MiB quota
            assert alice.store(objects(100 + batch, 16, prefix=f"flood{batch}@"))
        assert alice.load(list(objects(100, 1, prefix="flood0@"))) == [None]  # her own, evicted
    finally:
        alice.close()
        bob.close()
    tenant_gateway.restart()
    bob = Client(tenant_gateway, "bob", **bob_params)
    try:
        connected(bob.connector)
        assert bob.load(list(kept)) == list(kept.values())
    finally:
        bob.close()


@pytest.mark.parametrize(
    ("tenant", "params", "gateway_says"),
    [
        ("mallory", {}, "may not connect as tenant 'mallory'"),
        ("bob", {}, "wrong or missing token for tenant 'bob'"),
        ("eve", {}, "tenant 'eve' is not declared"),
    ],
)
def test_a_client_not_admitted_is_refused_with_a_clear_line_on_both_sides(
    tenant_gateway: Gateway,
    caplog: pytest.LogCaptureFixture,
    tenant: str,
    params: dict[str, str],
    gateway_says: str,
) -> None:
    caplog.set_level(logging.ERROR, logger="lmcache_adp")
    client = Client(tenant_gateway, tenant, reconnect_interval_s=0.1, **params)
    try:
        item = wait_for_future(client.connector, client.connector.submit_batch_exists(["k"]))
        assert item[1] is False and item[3] == [False]  # failed at once, not hung
        wait_until(lambda: gateway_says in tenant_gateway.log(), 10, "the gateway's refusal")
        assert f"refused client pid {os.getpid()} uid {os.getuid()}" in tenant_gateway.log()
        refusals = [r.getMessage() for r in caplog.records if "refused tenant" in r.getMessage()]
        assert len(refusals) == 1, refusals  # once, not at every retry
        assert f"refused tenant {tenant!r}" in refusals[0] and gateway_says in refusals[0]
    finally:
        client.close()


def test_a_wrong_token_file_stops_the_plugin_at_once(tmp_path: Path) -> None:
    from adp_gateway.errors import ConfigError

    with pytest.raises(ConfigError, match="cannot read token file"):
        ADPConnector(tenant="bob", token_file=str(tmp_path / "missing"))


def probe_as_nobody(gateway: Gateway, tenant: str) -> str:
    """Connect as ``tenant`` from a process running as uid ``nobody``, gid ``nogroup``: a fork
    that drops its credentials (the venv's interpreter may not be readable by ``nobody``).
    Returns "answered" or "failed", then what the plugin logged."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            records: list[str] = []
            handler = logging.Handler()
            handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
            logging.getLogger("lmcache_adp").addHandler(handler)
            logging.getLogger("lmcache_adp").setLevel(logging.INFO)
            client = Client(gateway, tenant)
            future = client.connector.submit_batch_exists(["k"])
            answered = wait_for_future(client.connector, future)[1]
            client.close()
            os.write(write_end, ("answered" if answered else "failed").encode())
            os.write(write_end, "\n".join(records).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        output = pipe.read().decode()
    os.waitpid(pid, 0)
    return output


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run a client as another user")
def test_the_socket_is_group_only_and_the_kernels_uid_and_gid_decide(
    workdir: Path, make_gateway: Callable[..., Gateway]
) -> None:
    workdir.chmod(0o755)  # let `nobody` reach the socket's directory
    config = write_config(workdir, "socket_group: nogroup\n")
    sockets = workdir / "sockets"  # made by the gateway, for the group
    gateway = make_gateway("64MiB", "--config", str(config), socket_path=sockets / "gw.sock")
    gateway.start()
    mode = os.stat(gateway.socket_path)
    assert stat.S_IMODE(mode.st_mode) == 0o660 and mode.st_gid == NOBODY
    assert stat.S_IMODE(os.stat(gateway.data_dir).st_mode) == 0o700
    assert probe_as_nobody(gateway, "carol").startswith("answered")  # gid nogroup admitted
    refused = probe_as_nobody(gateway, "alice")
    assert refused.startswith("failed") and "refused tenant 'alice'" in refused
    assert f"uid {NOBODY} gid {NOBODY} may not connect as tenant 'alice'" in gateway.log()
    os.chown(gateway.socket_path, -1, 0)  # a socket of group root: nobody cannot even connect
    assert probe_as_nobody(gateway, "carol").startswith("failed")


def test_other_tenants_and_other_cache_salts_miss_through_lmcache(
    tenant_gateway: Gateway, make_server: Callable[[str], LMCacheServer]
) -> None:
    token = str(tenant_gateway.log_path.parent / "bob.token")
    alice_server = make_server(tenant_gateway.l2_adapter_json(tenant="alice")).start()
    assert run_mp_client(alice_server, "store", 5, "--chunks", "2", "--cache-salt", "user1") == 0
    wait_until(alice_server.l2_settled, 60, "the L2 stores to finish")
    alice_server.clear_l1()
    assert run_mp_client(alice_server, "check", 5, "--chunks", "2", "--cache-salt", "user2") == 1
    assert run_mp_client(alice_server, "check", 5, "--chunks", "2") == 1  # unsalted
    assert (
        run_mp_client(
            alice_server,
            "check",
            5,
            "--chunks",
            "2",
            "--cache-salt",
            "user1",
            "--expect-tier",
            "l2",
        )
        == 0
    )
    alice_server.stop()
    bob_server = make_server(tenant_gateway.l2_adapter_json(tenant="bob", token_file=token)).start()
    assert run_mp_client(bob_server, "check", 5, "--chunks", "2", "--cache-salt", "user1") == 1


def hello_answer(gateway: Gateway, hello: Hello | None) -> str:
    """Connect and send ``hello`` (None: leave at once, as a probe does); the gateway's
    refusal, or "" when it welcomed the client or sent nothing."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(10)
        sock.connect(str(gateway.socket_path))
        if hello is None:
            return ""
        send_frame(sock, hello_body(hello))
        body, fds = recv_frame(sock, fds_max=4)
        for fd in fds:
            os.close(fd)
        return "" if body.get("ok") else str(body.get("error"))
    finally:
        sock.close()


def test_every_refusal_leaves_a_line_and_a_flood_is_counted_at_stop(
    tenant_gateway: Gateway,
) -> None:
    """A refusal right after another of the same uid is still logged when its reason differs
    (before, one line per 10 s for all peers and reasons: a wrong token after a harmless probe
    left no trace); a burst of one reason is folded, and its count is logged at stop."""
    uid = os.getuid()
    assert hello_answer(tenant_gateway, None) == ""  # a probe: connects and leaves
    wait_until(lambda: "peer closed the socket" in tenant_gateway.log(), 10, "the probe's line")
    assert "wrong or missing token" in hello_answer(tenant_gateway, Hello("bob", token="guess"))
    wait_until(
        lambda: "wrong or missing token for tenant 'bob'" in tenant_gateway.log(),
        10,
        "the wrong token's line, right after the probe's",
    )
    for attempt in range(5):
        hello_answer(tenant_gateway, Hello("bob", token=f"guess-{attempt}"))
    assert tenant_gateway.stop() == 0
    log = tenant_gateway.log()
    token_lines = [line for line in log.splitlines() if "wrong or missing token" in line]
    assert len(token_lines) == 2, token_lines  # the first; the other five, folded, at stop
    assert f"(and 4 more refusals like it of uid {uid} in the last 10 s)" in token_lines[1]


def test_a_refusal_names_no_other_tenant(tenant_gateway: Gateway) -> None:
    """A process that can open the socket learns nothing of the tenants it did not name."""
    told = hello_answer(tenant_gateway, Hello("eve"))
    assert "tenant 'eve' is not declared" in told
    for other in ("alice", "bob", "carol", "mallory"):
        assert other not in told
        assert other not in tenant_gateway.log().split("refused client", 1)[1]
