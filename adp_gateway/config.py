"""The gateway's settings: YAML file (``--config``), then command-line overrides, then checks.

Every key is documented in configs/gateway.yaml; tests/unit/test_config.py keeps the two in step.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field

from adp_gateway.errors import ConfigError, StartupError
from adp_gateway.policy.budget import parse_write_budget
from adp_gateway.tenants import TenantConfig, check_tenants
from adp_wire.protocol import default_socket_path
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
    session_arena_size: ByteSize = Field(default=256 * 2**10, ge=64 * 2**10)
    session_window_size: ByteSize = Field(default=512 * 2**20, ge=PAGE_BYTES)
    store_backlog_max: ByteSize = 2 * 2**30
    store_inflight_max: ByteSize = 64 * 2**20
    # the gateway's nice value, so that the model server's threads run first on a busy host
    # (adp_gateway/priority.py); 0 keeps the priority it was started with
    cpu_nice: int = Field(default=19, ge=0, le=19)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @property
    def socket_path(self) -> str:
        return self.socket or default_socket_path()

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
    """Fill in ``capacity`` from free space when unset, and check the data dirs can hold it."""
    for directory in config.data_dirs:
        _prepare_dir(directory)
    free = sum(_free_bytes_for(config, d) for d in config.data_dirs)
    capacity = config.capacity
    if capacity is None:
        capacity = _existing_capacity(config) or min(AUTO_CAPACITY_BYTES_MAX, free // 2)
    if config.data_dirs and capacity > free:
        raise StartupError(
            f"capacity is {format_size(capacity)} but {', '.join(config.data_dirs)} "
            f"can take only {format_size(free)} more: lower `capacity` or free space"
        )
    per_database = capacity // len(config.database_paths)
    if per_database < PAGE_BYTES + 2 * config.region_size:
        raise ConfigError(
            f"capacity {format_size(capacity)} gives each of the "
            f"{len(config.database_paths)} databases less than two regions of "
            f"{format_size(config.region_size)}: raise `capacity` or lower "
            "`region_size`"
        )
    resolved = config.model_copy(update={"capacity": capacity})
    region_quotas(resolved)
    return resolved


def region_quotas(config: GatewayConfig) -> dict[str, int]:
    """Tenant -> regions it may own per database, for the tenants with a quota; refuses quotas
    that round to fewer than two regions or that leave tenants without one too little."""
    assert config.capacity is not None
    databases = len(config.database_paths)
    regions = (config.capacity // databases - PAGE_BYTES) // config.region_size
    smallest = format_size(2 * databases * config.region_size)
    limits = {}
    for tenant in config.tenants:
        if tenant.quota is None:
            continue
        limits[tenant.name] = tenant.quota // (databases * config.region_size)
        if limits[tenant.name] < 2:
            raise ConfigError(
                f"tenants: {tenant.name!r}: a quota of {format_size(tenant.quota)} is less than "
                f"two regions on each of the {databases} databases: raise it to at least "
                f"{smallest} or lower `region_size`"
            )
    shared = 2 if any(t.quota is None for t in config.tenants) else 0
    if sum(limits.values()) + shared > regions:
        raise ConfigError(
            f"tenants: the quotas add up to more than the capacity "
            f"({format_size(config.capacity)}) can give"
            + (f", leaving tenants without a quota less than {smallest}" if shared else "")
            + ": lower the quotas or raise `capacity`"
        )
    return limits


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


def _free_bytes_for(config: GatewayConfig, directory: str) -> int:
    """Free space, counting the database files already there as ours to reuse."""
    existing = sum(
        os.path.getsize(p)
        for p in config.database_paths
        if p.startswith(str(Path(directory))) and os.path.exists(p)
    )
    return shutil.disk_usage(directory).free + existing
