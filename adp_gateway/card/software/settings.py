"""What the software card reads of the gateway's settings beyond every card's (``CardConfig``):
adp_gateway/config.py has them all, and a config without them is refused naming them."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from adp_gateway.card.base import CardConfig
from adp_gateway.errors import ConfigError


@runtime_checkable
class SoftwareCardConfig(CardConfig, Protocol):
    @property
    def region_size(self) -> int:
        """The unit of allocation and eviction."""

    @property
    def devices(self) -> list[str]:
        """The database paths that are raw block devices (not grown, not removed)."""

    @property
    def prepare_databases(self) -> bool:
        """Whether never-written regions are written once in the background."""

    @property
    def eviction(self) -> str:
        """Which region a full card reclaims: ``scan-resistant`` or ``lru`` (victims.py)."""

    def region_quotas(self) -> dict[str, int]:
        """Namespace -> the regions its pool may own per database."""


def software_config(config: CardConfig) -> SoftwareCardConfig:
    if not isinstance(config, SoftwareCardConfig):
        raise ConfigError(
            "card: software: the settings have no region_size, devices, prepare_databases, "
            "eviction or region quotas: give the software card the gateway's config"
        )
    return config
