"""The gateway's one exception tree: the errors it shares with the plugin (adp_wire/errors.py,
re-exported here) and its own. Every error carries a hint on how to fix it.

::

    GatewayError
     +-- ConfigError        a config file, flag or adapter param is wrong (names the field)
     +-- StartupError       the environment refuses us: data dir, socket, free space
     +-- ProtocolError      a client sent something malformed; that session is dropped
     +-- HandshakeRefused   the gateway refused a client at the handshake
     +-- UntrustedGateway   the plugin refused a gateway (its uid, or who can write its socket)
     +-- UnsupportedHost    this CPU's memory model is not one the rings are written for
     +-- StorageError       the disk failed an I/O; the op completes as a failure
          +-- StoreGivenUp  its client gave a zero-copy store up first; nothing was written
"""

from __future__ import annotations

from adp_wire.errors import (
    ConfigError,
    GatewayError,
    HandshakeRefused,
    ProtocolError,
    UnsupportedHost,
    UntrustedGateway,
)

__all__ = [
    "ConfigError",
    "GatewayError",
    "HandshakeRefused",
    "ProtocolError",
    "StartupError",
    "StorageError",
    "StoreGivenUp",
    "UnsupportedHost",
    "UntrustedGateway",
]


class StartupError(GatewayError):
    pass


class StorageError(GatewayError):
    pass


class StoreGivenUp(StorageError):
    """A zero-copy store its client gave up before the gateway wrote it: nothing was written."""
