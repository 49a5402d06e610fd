"""The gateway's settings: YAML file (``--config``), then command-line overrides, then checks.

Every key is documented in configs/gateway.yaml; tests/unit/test_config.py keeps the two in step.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field

from adp_gateway.errors import ConfigError, StartupError
from adp_gateway.front.tenants import TenantConfig, check_tenants
from adp_gateway.policy.budget import parse_write_budget
from adp_wire.protocol import ARENA_BYTES_MIN, default_socket_path
from adp_wire.ring.layout import PAGE_BYTES
from adp_wire.settings import ByteSize, OneOrMany, Settings, build
from adp_wire.units import format_size

AUTO_CAPACITY_BYTES_MAX = 64 * 2**30
RECORD_OVERHEAD_BYTES_MAX = 16 * 2**10  # header, footer entry (names up to 4 KiB), trailer


class GatewayConfig(Settings):
    socket: str | None = Field(
        default=None,
        description="Unix socket clients connect to; null: protocol.default_socket_path",
    )
    socket_group: str | None = Field(default=None, description="group owning the socket")
    max_sessions: int = Field(default=32, ge=1)
    metrics_address: str | None = Field(
        default=None, description="HOST:PORT of /metrics, /healthz, /readyz; null: off"
    )
    handshake_timeout_s: float = Field(default=5.0, ge=0.01)
    tenants: list[TenantConfig] = Field(default_factory=list)
    # software, memory, or a vendor card's package.module:Class (adp_gateway/card/loader.py)
    card: str = "software"
    data_dirs: OneOrMany[str] = Field(default_factory=lambda: ["./adp-data"])
    databases_per_dir: int = Field(default=1, ge=1)
    devices: OneOrMany[str] = Field(default_factory=list)
    capacity: ByteSize | None = None
    region_size: ByteSize = Field(default=64 * 2**20, ge=2 * PAGE_BYTES)
    eviction: Literal["scan-resistant", "lru"] = "scan-resistant"
    admission: bool = True
    write_budget: str | int | None = "1dwpd"  # bytes/s, drive writes per day, or none
    write_budget_burst_s: float = Field(default=86400.0, gt=0)
    fragment_size: ByteSize = Field(default=4 * 2**20, ge=PAGE_BYTES)
    prepare_databases: bool = True
    io_threads: int = Field(default=8, ge=1)
    sync: Literal["always", "periodic", "none"] = "periodic"
    sync_interval_ms: int = Field(default=100, ge=1)
    session_slots: int = Field(default=128, ge=1)
    session_arena_size: ByteSize = Field(default=256 * 2**10, ge=ARENA_BYTES_MIN)
    session_window_size: ByteSize = Field(default=512 * 2**20, ge=PAGE_BYTES)
    # null: no bound of the gateway's own; each session's slots bound its queued stores
    store_backlog_max: ByteSize | None = None
    # null: what the databases drain in 25 ms at the rate stores write
    # (adp_gateway/scheduling/write_depth.py)
    store_inflight_max: ByteSize | None = None
    # the gateway's nice value, so that the model server's threads run first on a busy host
    # (adp_gateway/host/priority.py); 0 keeps the priority it was started with
    cpu_nice: int = Field(default=19, ge=0, le=19)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @property
    def socket_path(self) -> str:
        return self.socket or default_socket_path()

    def region_quotas(self) -> dict[str, int]:
        """Tenant -> regions it may own per database, for the tenants with a quota; refuses quotas
        that round to fewer than two regions or that leave tenants without one too little."""
        assert self.capacity is not None
        databases = len(self.database_paths)
        regions = (self.capacity // databases - PAGE_BYTES) // self.region_size
        smallest = format_size(2 * databases * self.region_size)
        limits = {}
        for tenant in self.tenants:
            if tenant.quota is None:
                continue
            limits[tenant.name] = tenant.quota // (databases * self.region_size)
            if limits[tenant.name] < 2:
                raise ConfigError(
                    f"tenants: {tenant.name!r}: a quota of {format_size(tenant.quota)} is less "
                    f"than two regions on each of the {databases} databases: raise it to at least "
                    f"{smallest} or lower `region_size`"
                )
        shared = 2 if any(t.quota is None for t in self.tenants) else 0
        if sum(limits.values()) + shared > regions:
            raise ConfigError(
                f"tenants: the quotas add up to more than the capacity "
                f"({format_size(self.capacity)}) can give"
                + (f", leaving tenants without a quota less than {smallest}" if shared else "")
                + ": lower the quotas or raise `capacity`"
            )
        return limits

    @property
    def quotas(self) -> dict[str, int]:
        """Tenant -> its quota in bytes, for the tenants with one."""
        return {t.name: t.quota for t in self.tenants if t.quota is not None}

    @property
    def database_paths(self) -> list[str]:
        """One path per database: files in the data dirs, then raw block devices."""
        files = [
            str(Path(d) / f"db{i}.adp")
            for d in self.data_dirs
            for i in range(self.databases_per_dir)
        ]
        return files + list(self.devices)


_SIZE_ALIGNED = ("region_size", "fragment_size", "session_arena_size", "session_window_size")


def load(path: str | None, overrides: dict[str, Any]) -> GatewayConfig:
    """Read the YAML file at ``path`` (if any), apply non-None ``overrides`` and check it all."""
    flags = {k: v for k, v in overrides.items() if v is not None}
    # Checked alone first, so a bad flag is blamed on the command line, not on the file.
    build(GatewayConfig, flags, where="command line")
    values: dict[str, Any] = {}
    if path is not None:
        values = _read_yaml(path)
    config = build(GatewayConfig, {**values, **flags}, where=path or "gateway config")
    return _check(config)


def _read_yaml(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            values = yaml.safe_load(f) or {}
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: expected a mapping of settings at the top level")
    return values


def _check(config: GatewayConfig) -> GatewayConfig:
    for name in _SIZE_ALIGNED:
        if getattr(config, name) % PAGE_BYTES:
            raise ConfigError(f"{name}: must be a multiple of 4 KiB, got {getattr(config, name)}")
    if config.fragment_size + RECORD_OVERHEAD_BYTES_MAX > config.region_size:
        raise ConfigError(
            f"fragment_size ({format_size(config.fragment_size)}) plus 16 KiB (its header, "
            f"footer entry and the region's trailer) must fit in region_size "
            f"({format_size(config.region_size)})"
        )
    check_tenants(config.tenants)
    parse_write_budget(config.write_budget, 1)  # its form; the rate needs the capacity
    if not config.database_paths:
        raise ConfigError("no databases: set `data_dirs` or `devices`")
    seen: set[str] = set()
    for path in config.database_paths:
        real = os.path.realpath(path)
        if real in seen:
            raise ConfigError(f"{path} is named twice in `data_dirs` or `devices`")
        seen.add(real)
    return config


def resolve_capacity(config: GatewayConfig) -> GatewayConfig:
    """Fill in ``capacity`` from free space when unset, and check the data dirs can hold it.
    Free space is counted once per filesystem: two data dirs on one drive share its space. The
    memory card holds its values in RAM: its capacity is the config's, and no disk's concern."""
    if config.card == "memory":
        if config.capacity is None:
            raise ConfigError(
                "capacity: the memory card holds its values in RAM, so it takes no default from "
                "the disk's free space: set `capacity` to what the host's memory can spare"
            )
        return config
    for directory in config.data_dirs:
        _prepare_dir(directory)
    filesystems = _filesystems(config)
    capacity = config.capacity
    if capacity is None:
        room = sum(fs.free_bytes + fs.held_bytes for fs in filesystems)
        capacity = _existing_capacity(config) or min(AUTO_CAPACITY_BYTES_MAX, room // 2)
    per_database = capacity // len(config.database_paths)
    for fs in filesystems:
        needed = sum(max(0, per_database - held) for held in fs.files.values())
        if needed > fs.free_bytes:
            raise StartupError(
                f"capacity is {format_size(capacity)} but {', '.join(fs.directories)} "
                f"can take only {format_size(fs.free_bytes + fs.held_bytes)} more"
                f"{' (one filesystem)' if len(fs.directories) > 1 else ''}: lower "
                "`capacity` or free space"
            )
    if per_database < PAGE_BYTES + 2 * config.region_size:
        raise ConfigError(
            f"capacity {format_size(capacity)} gives each of the "
            f"{len(config.database_paths)} databases less than two regions of "
            f"{format_size(config.region_size)}: raise `capacity` or lower "
            "`region_size`"
        )
    resolved = config.model_copy(update={"capacity": capacity})
    resolved.region_quotas()  # refuses quotas the capacity cannot give
    return resolved


def make_dir(directory: str, mode: int, what: str, flag: str) -> None:
    """Create ``directory`` (the ``what`` of ``flag``) or say which flag to change."""
    try:
        os.makedirs(directory, mode=mode, exist_ok=True)
    except OSError as exc:
        raise StartupError(
            f"cannot create {what} {directory}: {exc.strerror}; choose another "
            f"`{flag}` or fix its permissions"
        ) from exc


def _prepare_dir(directory: str) -> None:
    make_dir(directory, 0o700, "data dir", "--data-dir")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise StartupError(
            f"data dir {directory} is not writable by this user; choose another "
            "`--data-dir` or fix its permissions"
        )


def _existing_capacity(config: GatewayConfig) -> int | None:
    """The capacity the database files were made with, when they all exist: an automatic
    capacity is derived once, not again from whatever space is free at each start."""
    files = config.database_paths[: len(config.database_paths) - len(config.devices)]
    if config.devices or not all(os.path.exists(p) for p in files):
        return None
    return sum(os.path.getsize(p) for p in files)


@dataclass
class _Filesystem:
    """The data dirs on one filesystem, its free space, and the database files in them with
    the bytes each holds already (reused, not needed again)."""

    directories: list[str] = field(default_factory=list)
    free_bytes: int = 0
    files: dict[str, int] = field(default_factory=dict)

    @property
    def held_bytes(self) -> int:
        return sum(self.files.values())


def _filesystems(config: GatewayConfig) -> list[_Filesystem]:
    found: dict[int, _Filesystem] = {}
    for directory in config.data_dirs:
        fs = found.setdefault(os.stat(directory).st_dev, _Filesystem())
        fs.directories.append(directory)
        fs.free_bytes = shutil.disk_usage(directory).free
        for i in range(config.databases_per_dir):
            path = str(Path(directory) / f"db{i}.adp")
            fs.files[path] = _held_bytes(path)
    return list(found.values())


def _held_bytes(path: str) -> int:
    """The bytes a database file holds already: its size, less what it leaves unallocated
    (a sparse file's holes need space when it is preallocated)."""
    try:
        info = os.stat(path)
    except OSError:
        return 0
    return min(info.st_size, info.st_blocks * 512)
