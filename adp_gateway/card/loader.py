"""Picks the card the config names: ``card: software`` (the default), ``card: memory``, or a
vendor's card by module path, ``package.module:Class`` (a subclass of ``Card``, importable where
the gateway runs)."""

from __future__ import annotations

import importlib

from adp_gateway.card.base import BuiltinCard, Card, CardContext
from adp_gateway.card.memory import MemoryCard
from adp_gateway.card.software.card import SoftwareCard
from adp_gateway.config import GatewayConfig
from adp_gateway.errors import ConfigError

BUILTIN: dict[BuiltinCard, type[Card]] = {
    BuiltinCard.SOFTWARE: SoftwareCard,
    BuiltinCard.MEMORY: MemoryCard,
}


def card_class(name: str) -> type[Card]:
    """The card class ``name`` names. Raises ConfigError naming the value and the choices."""
    if name in BuiltinCard.__members__.values():
        return BUILTIN[BuiltinCard(name)]
    choices = f"{', '.join(repr(str(c)) for c in BuiltinCard)}, or 'package.module:Class'"
    module_name, colon, class_name = name.partition(":")
    if not colon or not module_name or not class_name:
        raise ConfigError(f"card: {name!r} is not a card; choose {choices}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"card: {name!r}: module {module_name!r} cannot be imported ({exc}); choose {choices}"
        ) from exc
    found = getattr(module, class_name, None)
    if not (isinstance(found, type) and issubclass(found, Card)):
        raise ConfigError(
            f"card: {name!r}: {module_name} has no subclass of adp_gateway.card.base.Card named "
            f"{class_name!r}; choose {choices}"
        )
    return found


def open_card(config: GatewayConfig, context: CardContext) -> Card:
    """The card the config names, opened (not yet recovered)."""
    return card_class(config.card).open(config, context)
