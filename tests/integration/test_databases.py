"""Goal: several databases on several paths work as one store (issue 3, item 6).

Two data dirs (one per NVMe drive in production) each get a database file, and every large
object's fragments are striped over both, byte for byte, and survive a restart. When one of them
is lost or replaced while the gateway is stopped, the gateway still starts and the objects with a
fragment there become misses, never wrong bytes. A path in ``devices:`` (the remote placement:
an NVMe-oF namespace is a block device) is a database too: tested with a large regular file and,
where ``losetup`` works, with a loop device, which must take O_DIRECT and must be refused with one
clear line when it is smaller than its share of ``capacity``.

Everything runs against a real gateway process through the real plugin; the database files are
then read raw (the gateway stopped) to see where each fragment landed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml

from adp_gateway.card.software.format import RECORD_MAGIC, Kind, unpack_header, unpack_superblock
from adp_gateway.objects.names import parse
from adp_wire.ring.layout import PAGE_BYTES
from lmcache_adp import ADPConnector
from tests.support import Gateway, wait_for_future, wait_until
from tests.support.plugin import connected, objects, views

pytestmark = pytest.mark.integration

TENANT = "default"  # the plugin's default tenant
FRAGMENT = 256 * 2**10
LARGE_SIZES = (4 * FRAGMENT, 3 * FRAGMENT + 5)  # four fragments each, the second with a short tail
SMALL = 64 * 2**10 - 8  # one fragment: it lives on one database only
SENTINEL = 0xA5
SETTINGS: dict[str, Any] = {
    "capacity": "128MiB",
    "region_size": "8MiB",
    "fragment_size": FRAGMENT,
    "session_window_size": "16MiB",
    "io_threads": 2,
}


class ConfiguredGateway(Gateway):
    """A gateway started from a YAML file alone: Gateway's ``--data-dir`` would override
    ``data_dirs``."""

    def __init__(self, workdir: Path, name: str, settings: dict[str, Any]) -> None:
        super().__init__(workdir, socket_path=workdir / f"{name}.sock")
        self.log_path = workdir / f"{name}.log"
        config = workdir / f"{name}.yaml"
        config.write_text(yaml.safe_dump({"socket": str(self.socket_path), **SETTINGS, **settings}))
        self.args = ["--config", str(config)]

    def start_expecting_failure(self) -> tuple[int, str]:
        """Start it and wait for it to exit; its exit code and its output."""
        self.start(wait=False)
        wait_until(lambda: not self.alive or "listening on" in self.log(), 60, "the gateway")
        assert not self.alive, f"the gateway started:\n{self.log()}"
        assert self.proc is not None
        return self.proc.wait(10), self.log()


@pytest.fixture
def loop_devices(workdir: Path) -> Iterator[Callable[[int], Path]]:
    """Attach loop devices over sparse files; each is detached at teardown, pass or fail."""
    attached: list[str] = []

    def attach(size_bytes: int) -> Path:
        if os.geteuid() != 0:
            pytest.skip("loop devices need root")
        if shutil.which("losetup") is None:
            pytest.skip("losetup is not installed")
        backing = workdir / f"loop{len(attached)}.img"
        with open(backing, "wb") as f:
            f.truncate(size_bytes)
        result = subprocess.run(
            ["losetup", "--find", "--show", str(backing)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if result.returncode != 0:
            pytest.skip(f"losetup --find --show failed: {result.stderr.strip()}")
        device = result.stdout.strip()
        attached.append(device)
        if not os.path.exists(device):  # attached by the host kernel but not visible here
            pytest.skip(f"losetup attached {device} but there is no such node here")
        return Path(device)

    yield attach
    failures = []
    for device in attached:
        result = subprocess.run(
            ["losetup", "--detach", device], capture_output=True, text=True, timeout=30
        )
        if result.returncode != 0:
            failures.append(f"{device}: {result.stderr.strip()}")
    assert not failures, f"could not detach loop devices: {failures}"


@pytest.fixture
def make_configured(
    workdir: Path, loop_devices: Callable[[int], Path]
) -> Iterator[Callable[[str, dict[str, Any]], ConfiguredGateway]]:
    """Gateways from YAML settings; killed at teardown, before the loop devices are detached
    (hence the dependency on ``loop_devices``)."""
    made: list[ConfiguredGateway] = []

    def make(name: str, settings: dict[str, Any]) -> ConfiguredGateway:
        gateway = ConfiguredGateway(workdir, name, settings)
        made.append(gateway)
        return gateway

    yield make
    for gateway in made:
        gateway.kill()


@pytest.fixture
def connect() -> Iterator[Callable[[Gateway], ADPConnector]]:
    made: list[ADPConnector] = []

    def make(gateway: Gateway) -> ADPConnector:
        connector = ADPConnector(**gateway.adapter_params(reconnect_interval_s=0.1))
        made.append(connector)
        connected(connector)
        return connector

    yield make
    for connector in made:
        connector.close()


def put(
    connector: ADPConnector, prefix: str, sizes: tuple[int, ...], count: int, seed: int
) -> dict[str, bytearray]:
    """Store ``count`` random objects of each size; returns them by key."""
    stored: dict[str, bytearray] = {}
    for n, size in enumerate(sizes):
        keys = [f"m@00000000@0@{prefix}-{size}-{i:060x}" for i in range(count)]
        data = objects(count, size, seed=seed * 100 + n)
        item = wait_for_future(connector, connector.submit_batch_set(keys, views(data)))
        assert item[1] is True and item[3] == [True] * count, item
        stored.update(zip(keys, data, strict=True))
    return stored


def check_loads(
    connector: ADPConnector, stored: dict[str, bytearray], expect_hits: set[str]
) -> None:
    """Exactly ``expect_hits`` load, byte for byte; every other load is a miss that leaves the
    caller's buffer untouched; EXISTS agrees."""
    hits = set()
    by_size: dict[int, list[str]] = {}
    for key, data in stored.items():
        by_size.setdefault(len(data), []).append(key)
    for size, keys in by_size.items():
        out = [bytearray([SENTINEL]) * size for _ in keys]
        item = wait_for_future(connector, connector.submit_batch_get(keys, views(out)))
        assert len(item[3]) == len(keys), item
        for key, hit, got in zip(keys, item[3], out, strict=True):
            if hit:
                assert got == stored[key], f"{key}: a hit with wrong bytes"
                hits.add(key)
            else:
                assert got == bytearray([SENTINEL]) * size, f"{key}: a miss wrote the buffer"
    missing, unexpected = sorted(expect_hits - hits), sorted(hits - expect_hits)
    assert not missing and not unexpected, f"misses {missing}, unexpected hits {unexpected}"
    keys = list(stored)
    item = wait_for_future(connector, connector.submit_batch_exists(keys))
    assert item[3] == [key in expect_hits for key in keys]


class OnDisk(NamedTuple):
    offset: int  # in the object
    fragments: int  # of the object
    payload: bytes


def fragments_in(path: Path) -> dict[str, dict[int, OnDisk]]:
    """Every valid data record in a database file or device: key -> fragment index -> record
    (a record holds one fragment, named after its object: adp_gateway/objects/names.py).

    A record is a header with magic b"ADPFRAG1" on a 4 KiB boundary whose checksum holds under
    the salt in the database's superblock (so a payload cannot pass for one), then its payload.
    Read raw, with the gateway stopped.
    """
    data = path.read_bytes()
    superblock = unpack_superblock(memoryview(data)[:PAGE_BYTES])
    assert superblock is not None, f"{path} has no superblock"
    found: dict[str, dict[int, OnDisk]] = {}
    at = data.find(RECORD_MAGIC, PAGE_BYTES)
    while at != -1:
        if at % PAGE_BYTES == 0:
            header = unpack_header(memoryview(data)[at : at + PAGE_BYTES], superblock.salt)
            named = parse(header.key) if header is not None else None  # objects/names.py
            if header is not None and header.kind == Kind.DATA and header.tenant == TENANT:
                assert named is not None, f"{header.key}: not the name of a fragment"
                payload = data[at + PAGE_BYTES : at + PAGE_BYTES + header.fragment_bytes]
                fragments = found.setdefault(named.key, {})
                assert named.place not in fragments, f"{header.key} twice in {path}"
                offset, _ = named.version.span(named.place)
                fragments[named.place] = OnDisk(offset, named.version.fragments, payload)
        at = data.find(RECORD_MAGIC, at + 1)
    return found


def check_striped(
    stored: dict[str, bytearray], databases: list[dict[str, dict[int, OnDisk]]]
) -> dict[str, Counter[int]]:
    """Each object's fragments are all on disk exactly once, byte for byte, spread over the
    databases as evenly as they go (each holds the floor or ceiling of fragments / databases).
    Returns, per object, how many of its fragments each database holds."""
    spread: dict[str, Counter[int]] = {}
    for key, data in stored.items():
        count = max(1, -(-len(data) // FRAGMENT))
        where: dict[int, int] = {}
        for database, found in enumerate(databases):
            for index, record in found.get(key, {}).items():
                assert index not in where, f"{key}: fragment {index} on two databases"
                where[index] = database
                start = index * FRAGMENT
                assert record == OnDisk(start, count, bytes(data[start : start + FRAGMENT])), (
                    f"{key}: fragment {index} on database {database} is not the object's bytes"
                )
        assert sorted(where) == list(range(count)), f"{key}: fragments on disk {sorted(where)}"
        spread[key] = Counter(where.values())
        shares = [spread[key][d] for d in range(len(databases))]
        assert max(shares) - min(shares) <= 1, f"{key}: fragments per database {shares}"
    return spread


def database_files(dirs: list[Path]) -> list[Path]:
    files = sorted(p for d in dirs for p in d.iterdir())
    assert files == [d / "db0.adp" for d in dirs]
    return files


def test_two_data_dirs_stripe_every_large_object_over_both_and_survive_a_restart(
    make_configured: Callable[[str, dict[str, Any]], ConfiguredGateway],
    connect: Callable[[Gateway], ADPConnector],
    workdir: Path,
) -> None:
    dirs = [workdir / "nvme0", workdir / "nvme1"]
    gateway = make_configured("two-dirs", {"data_dirs": [str(d) for d in dirs]}).start()
    connector = connect(gateway)
    stored = put(connector, "big", LARGE_SIZES, count=4, seed=1)
    check_loads(connector, stored, set(stored))
    assert gateway.stop() == 0

    spread = check_striped(stored, [fragments_in(f) for f in database_files(dirs)])
    assert all(s == Counter({0: 2, 1: 2}) for s in spread.values()), spread

    gateway.start()
    connected(connector)
    check_loads(connector, stored, set(stored))


def _keep(path: Path, workdir: Path) -> Path:
    copy = workdir / f"kept-{path.parent.name}-{path.name}"
    shutil.copyfile(path, copy)
    return copy


@pytest.mark.parametrize("damage", ["deleted", "other dir's file", "older copy"])
def test_a_lost_or_replaced_database_turns_only_its_objects_into_misses(
    make_configured: Callable[[str, dict[str, Any]], ConfiguredGateway],
    connect: Callable[[Gateway], ADPConnector],
    workdir: Path,
    damage: str,
) -> None:
    dirs = [workdir / "nvme0", workdir / "nvme1"]
    gateway = make_configured("damage", {"data_dirs": [str(d) for d in dirs]}).start()
    connector = connect(gateway)
    first = put(connector, "first", (LARGE_SIZES[0], SMALL), count=8, seed=2)
    older = None
    if damage == "older copy":
        assert gateway.stop() == 0
        older = _keep(dirs[1] / "db0.adp", workdir)
        gateway.start()
        connected(connector)
    second = put(connector, "second", (LARGE_SIZES[1], SMALL), count=8, seed=3)
    stored = first | second
    check_loads(connector, stored, set(stored))
    assert gateway.stop() == 0

    a_file, b_file = database_files(dirs)
    spread = check_striped(stored, [fragments_in(a_file), fragments_in(b_file)])
    only_on_a = {key for key, s in spread.items() if s[1] == 0}
    # The keys are fixed, so this holds or fails the same way every run: small objects on each
    # side, so the damage below must keep some loads and lose others.
    smalls = {key for key, data in stored.items() if len(data) == SMALL}
    assert smalls & only_on_a and smalls - only_on_a, spread

    if damage == "deleted":
        b_file.unlink()
        expect = only_on_a
    elif damage == "other dir's file":
        shutil.copyfile(a_file, b_file)
        expect = only_on_a
    else:
        assert older is not None
        os.replace(older, b_file)
        expect = only_on_a | set(first)

    gateway.start()  # still starts
    assert gateway.alive
    connected(connector)
    check_loads(connector, stored, expect)

    # The replaced database takes new objects again, striped with the other one.
    fresh = put(connector, "fresh", (LARGE_SIZES[0],), count=2, seed=4)
    check_loads(connector, fresh, set(fresh))
    assert gateway.stop() == 0
    check_striped(fresh, [fragments_in(f) for f in database_files(dirs)])
    gateway.start()
    connected(connector)
    check_loads(connector, stored | fresh, expect | set(fresh))


@pytest.mark.parametrize("with_data_dir", [False, True], ids=["device only", "dir and device"])
def test_a_large_regular_file_in_devices_is_a_database(
    make_configured: Callable[[str, dict[str, Any]], ConfiguredGateway],
    connect: Callable[[Gateway], ADPConnector],
    workdir: Path,
    with_data_dir: bool,
) -> None:
    image = workdir / "namespace.img"  # stands in for an NVMe-oF namespace
    image_bytes = 512 * 2**20
    with open(image, "wb") as f:
        f.truncate(image_bytes)
    data_dirs = [workdir / "nvme0"] if with_data_dir else []
    gateway = make_configured(
        "device-file",
        {
            "data_dirs": [str(d) for d in data_dirs],
            "devices": [str(image)],
            "capacity": "256MiB" if with_data_dir else "512MiB",
        },
    ).start()
    connector = connect(gateway)
    stored = put(connector, "dev", (*LARGE_SIZES, SMALL), count=3, seed=5)
    check_loads(connector, stored, set(stored))
    assert gateway.stop() == 0

    assert image.stat().st_size == image_bytes  # used in place: neither grown nor cut
    files = [d / "db0.adp" for d in data_dirs] + [image]
    spread = check_striped(stored, [fragments_in(f) for f in files])
    large = [key for key, data in stored.items() if len(data) > FRAGMENT]
    assert all(len(spread[key]) == len(files) for key in large), spread

    gateway.start()
    connected(connector)
    check_loads(connector, stored, set(stored))
    assert image.stat().st_size == image_bytes


def test_a_loop_device_is_a_database_with_o_direct(
    make_configured: Callable[[str, dict[str, Any]], ConfiguredGateway],
    connect: Callable[[Gateway], ADPConnector],
    loop_devices: Callable[[int], Path],
    workdir: Path,
) -> None:
    device = loop_devices(256 * 2**20)
    os.close(os.open(device, os.O_RDONLY | os.O_DIRECT))  # a block device takes O_DIRECT
    data_dir = workdir / "nvme0"
    gateway = make_configured(
        "loop",
        {"data_dirs": [str(data_dir)], "devices": [str(device)], "capacity": "512MiB"},
    ).start()
    assert f"{device} refuses O_DIRECT" not in gateway.log()
    connector = connect(gateway)
    stored = put(connector, "loop", (*LARGE_SIZES, SMALL), count=3, seed=6)
    check_loads(connector, stored, set(stored))
    assert gateway.stop() == 0

    spread = check_striped(stored, [fragments_in(data_dir / "db0.adp"), fragments_in(device)])
    large = [key for key, data in stored.items() if len(data) > FRAGMENT]
    assert all(spread[key] == Counter({0: 2, 1: 2}) for key in large), spread

    gateway.start()
    connected(connector)
    check_loads(connector, stored, set(stored))
    assert f"{device} refuses O_DIRECT" not in gateway.log()


def one_line_error(code: int, output: str) -> str:
    assert code == 2, output
    lines = [line for line in output.splitlines() if line.startswith("adp-gateway:")]
    assert len(lines) == 1 and "Traceback" not in output, output
    return lines[0]


def test_a_device_smaller_than_its_share_of_capacity_is_refused_in_one_line(
    make_configured: Callable[[str, dict[str, Any]], ConfiguredGateway],
    loop_devices: Callable[[int], Path],
) -> None:
    device = loop_devices(64 * 2**20)
    gateway = make_configured("small-loop", {"data_dirs": [], "devices": [str(device)]})
    line = one_line_error(*gateway.start_expecting_failure())
    assert str(device) in line and "`capacity`" in line, line


@pytest.mark.parametrize("present", [True, False], ids=["smaller file", "missing path"])
def test_a_devices_path_that_is_not_big_enough_is_refused_not_grown(
    make_configured: Callable[[str, dict[str, Any]], ConfiguredGateway],
    workdir: Path,
    present: bool,
) -> None:
    path = workdir / "nvme9n1"
    if present:
        with open(path, "wb") as f:
            f.truncate(64 * 2**20)
    gateway = make_configured("small-file", {"data_dirs": [], "devices": [str(path)]})
    line = one_line_error(*gateway.start_expecting_failure())
    assert str(path) in line, line
    assert path.exists() == present
    assert not present or path.stat().st_size == 64 * 2**20
