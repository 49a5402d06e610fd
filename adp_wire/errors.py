"""The exception tree both sides share. Every error carries a hint on how to fix it.

::

    GatewayError
     +-- ConfigError        a config file, flag or adapter param is wrong (names the field)
     +-- ProtocolError      a peer sent something malformed; that session is dropped
     +-- HandshakeRefused   the gateway refused a client at the handshake
     +-- UntrustedGateway   the plugin refused a gateway (its uid, or who can write its socket)
     +-- UnsupportedHost    this CPU's memory model is not one the rings are written for

The gateway adds its own errors under the same base (adp_gateway/errors.py), so a caller of
either side catches ``GatewayError`` for all of them.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "GatewayError",
    "HandshakeRefused",
    "ProtocolError",
    "UnsupportedHost",
    "UntrustedGateway",
]


class GatewayError(Exception):
    """Base class: ``str(error)`` is one line naming what is wrong and how to fix it."""


class ConfigError(GatewayError):
    pass


class ProtocolError(GatewayError):
    pass


class HandshakeRefused(GatewayError):
    pass


class UntrustedGateway(GatewayError):
    pass


class UnsupportedHost(GatewayError):
    pass
