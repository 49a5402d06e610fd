"""The gateway's one exception tree. Every error carries a hint on how to fix it.

::

    GatewayError
     +-- ConfigError        a config file, flag or adapter param is wrong (names the field)
     +-- StartupError       the environment refuses us: data dir, socket, free space
     +-- ProtocolError      a client sent something malformed; that session is dropped
     +-- HandshakeRefused   the gateway refused a client at the handshake
     +-- UntrustedGateway   the plugin refused a gateway (its uid, or who can write its socket)
     +-- UnsupportedHost    this CPU's memory model is not one the rings are written for
     +-- StorageError       the disk failed an I/O; the op completes as a failure
"""

from __future__ import annotations


class GatewayError(Exception):
    """Base class: ``str(error)`` is one line naming what is wrong and how to fix it."""


class ConfigError(GatewayError):
    pass


class StartupError(GatewayError):
    pass


class ProtocolError(GatewayError):
    pass


class HandshakeRefused(GatewayError):
    pass


class UntrustedGateway(GatewayError):
    pass


class UnsupportedHost(GatewayError):
    pass


class StorageError(GatewayError):
    pass
