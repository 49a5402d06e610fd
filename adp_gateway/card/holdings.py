"""Who hears of the names a holder holds. A card tells the object store above it of its values
(adp_gateway/objects/), and the object store tells the gateway's presence tables of its objects
(adp_gateway/sessions/presence.py), so that each answers lookups as the ``exists`` below it
would."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol


class Holdings(Protocol):
    """``recovered`` with the names a recovery found (per namespace, before anything else),
    ``added`` when a name comes to be held (not when a held name is overwritten), ``removed``
    when it is no longer held. Calls may come from any thread, and while the holder holds its
    own locks: they never call back into it."""

    def recovered(self, namespace: str, names: Iterable[str], /) -> None: ...

    def added(self, namespace: str, name: str, /) -> None: ...

    def removed(self, namespace: str, name: str, /) -> None: ...


class NoHoldings:
    """Holdings nobody hears: for a card or store made without a gateway (tests, tools)."""

    def recovered(self, namespace: str, names: Iterable[str], /) -> None:
        pass

    def added(self, namespace: str, name: str, /) -> None:
        pass

    def removed(self, namespace: str, name: str, /) -> None:
        pass


NO_HOLDINGS = NoHoldings()
