"""What a card tells the gateway of the keys it holds, so the gateway's presence tables
(adp_gateway/presence.py) answer lookups as the card's ``exists`` would (card/base.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol


class Holdings(Protocol):
    """Who hears of the keys a card holds: ``recovered`` with the keys a recovery found (per
    tenant, before anything else), ``added`` when a key comes to be held (not when a held key
    is overwritten), ``removed`` when it is no longer held. Calls may come from any thread,
    and while the card holds its own locks: they never call back into the card."""

    def recovered(self, tenant: str, keys: Iterable[str]) -> None: ...

    def added(self, tenant: str, key: str) -> None: ...

    def removed(self, tenant: str, key: str) -> None: ...


class NoHoldings:
    """Holdings nobody hears: for a card made without a gateway (tests, tools)."""

    def recovered(self, tenant: str, keys: Iterable[str]) -> None:
        pass

    def added(self, tenant: str, key: str) -> None:
        pass

    def removed(self, tenant: str, key: str) -> None:
        pass


NO_HOLDINGS = NoHoldings()
