"""Tenants: who may connect as which tenant, and how much of the card each may hold.

The gateway config declares tenants (``tenants:`` in configs/gateway.yaml). A client names its
tenant in the handshake; the gateway admits it only if the peer process's uid or gid, read with
SO_PEERCRED (the kernel's word, not the client's), is one the tenant lists, and if the tenant
has a token file, the client sent the same token. With no tenants declared the gateway is in
open mode: whoever can open the socket (mode 0660, ``socket_group``) may use any tenant name.

A tenant with a ``quota`` owns whole regions of every database, at most its quota's worth, and
evicts only its own objects to make room (card/software/regionlog.py). Tenants without one
share the regions nobody's quota reserves, and evict each other's objects in LRU order.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from pydantic import Field

from adp_gateway.errors import ConfigError, GatewayError
from adp_wire.protocol import TENANT_BYTES_MAX, Hello
from adp_wire.settings import ByteSize, OneOrMany, Settings
from adp_wire.tokens import read_token


class AccessDenied(GatewayError):
    """A client may not connect as the tenant it named (or ask for status); the message says
    why, naming no tenant but the one it asked for. ``kind`` says which check refused it."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


class TenantConfig(Settings):
    name: str = Field(description="the tenant name clients send (adapter_params.tenant)")
    uids: OneOrMany[int] = Field(default_factory=list, description="Unix users admitted")
    gids: OneOrMany[int] = Field(default_factory=list, description="Unix groups admitted")
    token_file: str | None = Field(
        default=None, description="file holding a secret the client must also present"
    )
    quota: ByteSize | None = Field(default=None, description="disk space this tenant may fill")


@dataclass(frozen=True)
class Peer:
    pid: int
    uid: int
    gid: int

    def __str__(self) -> str:
        return f"pid {self.pid} uid {self.uid} gid {self.gid}"


class Tenants:
    def __init__(self, tenants: list[TenantConfig]) -> None:
        check_tenants(tenants)
        self._tenants = {t.name: t for t in tenants}
        self._tokens = {t.name: read_token(t.token_file) for t in tenants if t.token_file}

    @property
    def open_mode(self) -> bool:
        return not self._tenants

    def declares(self, peer: Peer) -> bool:
        """Whether a tenant lists ``peer``'s uid or gid (its handshakes get their own slots)."""
        return any(peer.uid in t.uids or peer.gid in t.gids for t in self._tenants.values())

    def admit(self, hello: Hello, peer: Peer) -> None:
        """Raise AccessDenied unless ``peer`` may connect as ``hello.tenant``."""
        if self.open_mode:
            return
        tenant = self._tenants.get(hello.tenant)
        if tenant is None:
            raise AccessDenied(
                f"tenant {hello.tenant!r} is not declared in the gateway config: declare it "
                "in `tenants`, or set the plugin's adapter_params.tenant to a declared one",
                "undeclared tenant",
            )
        if (tenant.uids or tenant.gids) and not (
            peer.uid in tenant.uids or peer.gid in tenant.gids
        ):
            raise AccessDenied(
                f"uid {peer.uid} gid {peer.gid} may not connect as tenant {hello.tenant!r}: "
                "add the uid or gid to the tenant's `uids` or `gids`",
                "uid not admitted",
            )
        expected = self._tokens.get(hello.tenant)
        if expected is not None and not hmac.compare_digest(
            (hello.token or "").encode(), expected.encode()
        ):
            raise AccessDenied(
                f"wrong or missing token for tenant {hello.tenant!r}: set the plugin's "
                "adapter_params.token_file to a copy of the tenant's token file",
                "wrong token",
            )


def check_tenants(tenants: list[TenantConfig]) -> None:
    """Refuse tenant declarations that would admit anybody or cannot be told apart."""
    seen: set[str] = set()
    for tenant in tenants:
        where = f"tenants: {tenant.name!r}"
        if not 0 < len(tenant.name.encode()) <= TENANT_BYTES_MAX:
            raise ConfigError(f"tenants: a name must be 1..{TENANT_BYTES_MAX} bytes")
        if tenant.name in seen:
            raise ConfigError(f"{where} is declared twice")
        seen.add(tenant.name)
        if not (tenant.uids or tenant.gids or tenant.token_file):
            raise ConfigError(
                f"{where} would admit anybody: give it `uids`, `gids` or a `token_file`"
            )
        if tenant.quota is not None and tenant.quota <= 0:
            raise ConfigError(f"{where}: quota must be positive")
