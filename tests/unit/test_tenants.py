"""Goal: a client is admitted only as a tenant its kernel-checked uid/gid (and token) allow, and
a tenant's objects are its own: other tenants cannot read, find, delete or evict them, even under
identical keys; each quota holds independently, across restarts."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from adp_gateway import config as gateway_config
from adp_gateway.card.software.devices.filedevice import FileDevice
from adp_gateway.card.software.regionlog import Pools
from adp_gateway.errors import ConfigError
from adp_gateway.front.tenants import AccessDenied, Peer, TenantConfig, Tenants
from adp_gateway.objects.store import ObjectStore
from adp_wire.protocol import Hello
from tests.support.storage import REGION, extent, open_store, payload

ROOT_PEER = Peer(100, 0, 0)
USER_PEER = Peer(101, 1000, 1000)


def token_file(tmp_path: Path, secret: str, mode: int = 0o600) -> str:
    path = tmp_path / f"token-{secret or 'empty'}"
    path.write_text(secret + "\n")
    path.chmod(mode)
    return str(path)


def test_open_mode_admits_anybody_as_any_tenant() -> None:
    Tenants([]).admit(Hello("whoever"), USER_PEER)


def test_uid_gid_and_token_decide_who_is_admitted(tmp_path: Path) -> None:
    tenants = Tenants(
        [
            TenantConfig(name="ops", uids=[0]),
            TenantConfig(name="users", gids=[1000]),
            TenantConfig(name="secret", uids=[1000], token_file=token_file(tmp_path, "s3cret")),
        ]
    )
    tenants.admit(Hello("ops"), ROOT_PEER)
    tenants.admit(Hello("users"), USER_PEER)
    tenants.admit(Hello("secret", token="s3cret"), USER_PEER)
    refusals = [
        (Hello("ops"), USER_PEER, "uid 1000 gid 1000 may not connect as tenant 'ops'"),
        (Hello("users"), ROOT_PEER, "uid 0 gid 0 may not connect as tenant 'users'"),
        (Hello("secret"), USER_PEER, "wrong or missing token for tenant 'secret'"),
        (Hello("secret", token="guess"), USER_PEER, "wrong or missing token"),
        (Hello("secret", token="s3cret"), ROOT_PEER, "may not connect"),
        (Hello("nobody"), ROOT_PEER, "tenant 'nobody' is not declared"),
        (Hello("ops"), Peer(-1, -1, -1), "may not connect"),  # credentials unknown
    ]
    for hello, peer, message in refusals:
        with pytest.raises(AccessDenied, match=message):
            tenants.admit(hello, peer)


@pytest.mark.parametrize(
    ("tenants", "match"),
    [
        ("[{name: a}]", "would admit anybody"),
        ("[{name: a, uids: [1]}, {name: a, gids: [1]}]", "declared twice"),
        ("[{uids: [1]}]", r"tenants\[0\]: missing key 'name'"),
        ("[{name: a, uid: [1]}]", "unknown key 'uid'; did you mean 'uids'"),
        ("[{name: a, uids: [root]}]", r"tenants\[0\]\.uids\[0\]: expected an integer, got"),
        ("[{name: a, uids: [true]}]", r"tenants\[0\]\.uids\[0\]: expected an integer, got"),
        ("[{name: a, uids: [1], quota: lots}]", r"tenants\[0\].quota"),
        ("{name: a}", "tenants: expected a list of mappings"),
        ("[a]", r"tenants\[0\]: expected a mapping"),
        ("[{name: '', uids: [1]}]", "a name must be 1..64 bytes"),
    ],
)
def test_bad_tenant_declarations_are_named(tmp_path: Path, tenants: str, match: str) -> None:
    path = tmp_path / "g.yaml"
    path.write_text(f"tenants: {tenants}\n")
    with pytest.raises(ConfigError, match=match):
        gateway_config.load(str(path), {})


def test_token_files_must_be_private_and_not_empty(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="readable by every user: chmod o-r"):
        Tenants([TenantConfig(name="a", token_file=token_file(tmp_path, "x", 0o644))])
    with pytest.raises(ConfigError, match="is empty"):
        Tenants([TenantConfig(name="a", token_file=token_file(tmp_path, ""))])
    with pytest.raises(ConfigError, match="cannot read token file"):
        Tenants([TenantConfig(name="a", token_file=str(tmp_path / "missing"))])


@pytest.mark.parametrize(
    ("quotas", "match"),
    [
        ({"a": "3MiB"}, "less than two regions on each of the 2 databases"),
        ({"a": "40MiB", "b": "30MiB"}, "quotas add up to more than the capacity"),
    ],
)
def test_quotas_that_cannot_hold_are_refused(
    tmp_path: Path, quotas: dict[str, str], match: str
) -> None:
    config = gateway_config.load(
        None,
        {
            "data_dirs": [str(tmp_path / "d0"), str(tmp_path / "d1")],
            "capacity": "64MiB",
            "region_size": "1MiB",
            "fragment_size": "256KiB",
            "tenants": [{"name": n, "uids": [0], "quota": q} for n, q in quotas.items()],
        },
    )
    assert [t.name for t in config.tenants] == list(quotas)
    with pytest.raises(ConfigError, match=match):
        gateway_config.resolve_capacity(config)


# Two databases of twelve regions: tenants "a" and "b" may own three regions of each, every
# other tenant shares the six left.
DATABASE_BYTES = 4096 + 12 * REGION
POOLS = Pools({"a": 3, "b": 3})
OBJECT_BYTES = 40_000  # one fragment; about six per region


def store_at(tmp_path: Path, pools: Pools = POOLS) -> ObjectStore:
    devices = [FileDevice(str(tmp_path / f"db{i}.adp"), DATABASE_BYTES) for i in range(2)]
    return open_store(devices, pools=pools)


def put_all(store: ObjectStore, tenant: str, objects: dict[str, bytes]) -> None:
    for key, data in objects.items():
        store.put(tenant, key, extent(data), len(data))


def read(store: ObjectStore, tenant: str, key: str, size: int = OBJECT_BYTES) -> bytes | None:
    out = extent(bytes(size))
    return bytes(out[:size]) if store.get(tenant, key, out, size) else None


def flood(store: ObjectStore, tenant: str, times: int, check: Callable[[], None]) -> None:
    """``tenant`` writes ``times`` its whole quota's worth of new objects."""
    _, limit = store.pool_bytes(tenant)
    for i in range(times * limit // OBJECT_BYTES):
        store.put(tenant, f"flood{i}", extent(payload(i % 7, OBJECT_BYTES)), OBJECT_BYTES)
        if i % 16 == 0:
            check()


def within_quota(store: ObjectStore, tenant: str) -> None:
    held, limit = store.pool_bytes(tenant)
    assert held <= limit, f"tenant {tenant!r} holds {held} bytes, its quota is {limit}"


def test_identical_keys_in_two_tenants_are_two_objects(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    mine = {f"k{i}": payload(i, OBJECT_BYTES) for i in range(8)}
    theirs = {f"k{i}": payload(100 + i, OBJECT_BYTES) for i in range(4)}
    put_all(store, "a", mine)
    put_all(store, "b", theirs)
    assert store.exists("b", list(mine)) == [True] * 4 + [False] * 4
    assert store.delete("b", ["k5", "k6"]) == [False, False]
    assert store.delete("b", ["k0"]) == [True]
    assert store.exists("a", ["k0"]) == [True]
    for key, data in mine.items():
        assert read(store, "a", key) == data
    assert read(store, "b", "k1") == theirs["k1"]
    assert read(store, "c", "k1") is None


def test_a_tenant_flooding_its_quota_evicts_only_its_own_objects(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    kept = {
        tenant: {f"k{i}": payload(ord(tenant) * 100 + i, OBJECT_BYTES) for i in range(12)}
        for tenant in ("b", "c", "d")  # b has a quota; c and d share the rest
    }
    for tenant, objects in kept.items():
        put_all(store, tenant, objects)
    flood(store, "a", 4, lambda: within_quota(store, "a"))
    assert store.statistics().reclaims >= 6
    assert read(store, "a", "flood0") is None  # a's oldest went to make room for a's newest
    for tenant, objects in kept.items():
        for key, data in objects.items():
            assert read(store, tenant, key) == data, f"{tenant}/{key} evicted by tenant a"


def test_quotas_hold_across_restarts(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    theirs = {f"k{i}": payload(i, OBJECT_BYTES) for i in range(12)}
    put_all(store, "b", theirs)
    flood(store, "a", 2, lambda: within_quota(store, "a"))
    store.close()
    store = store_at(tmp_path)
    within_quota(store, "a")
    assert store.pool_bytes("a")[0] > 0
    flood(store, "a", 2, lambda: within_quota(store, "a"))
    flood(store, "c", 2, lambda: within_quota(store, "c"))
    for key, data in theirs.items():
        assert read(store, "b", key) == data
    store.close()


def test_a_lowered_quota_gives_its_regions_back_when_others_need_them(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    flood(store, "a", 1, lambda: None)
    assert store.pool_bytes("a")[0] == 6 * REGION
    store.close()
    store = store_at(tmp_path, Pools({"a": 2, "b": 3}))
    flood(store, "c", 2, lambda: None)
    assert store.pool_bytes("a")[0] == 6 * REGION  # nobody needed its regions yet
    flood(store, "b", 1, lambda: within_quota(store, "b"))
    within_quota(store, "a")
    store.close()


def test_data_dir_and_database_files_are_private(tmp_path: Path) -> None:
    config = gateway_config.load(None, {"data_dirs": str(tmp_path / "data"), "capacity": "1GiB"})
    gateway_config.resolve_capacity(config)
    assert (os.stat(tmp_path / "data").st_mode & 0o777) == 0o700
    device = FileDevice(str(tmp_path / "data" / "db0.adp"), 4 * 2**20)
    device.close()
    assert (os.stat(tmp_path / "data" / "db0.adp").st_mode & 0o777) == 0o600
