"""The plugin's ``adapter_params``, checked field by field.

plugin_manifest.yaml documents the same fields; tests/unit/test_settings.py keeps them in step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from adp_gateway import fields  # moves to adp_wire.settings with the pydantic settings
from adp_wire.protocol import default_socket_path


@dataclass(frozen=True)
class ADPParams:
    socket_path: str | None = field(
        default=None,
        metadata={
            "help": "Unix socket of the gateway (adp-gateway serve --socket); null: the "
            "gateway's default (adp_wire.protocol.default_socket_path)"
        },
    )
    gateway_uids: list[int] | None = field(
        default=None,
        metadata={
            "help": "uids the gateway may run as; the plugin refuses any other listener, and "
            "a socket directory anyone else can write; root always counts. null: the "
            "plugin's own user"
        },
    )
    tenant: str = field(
        default="default",
        metadata={"help": "tenant name sent at the handshake; objects are namespaced by it"},
    )
    token_file: str | None = field(
        default=None,
        metadata={"help": "file holding the tenant's secret token, if its gateway asks for one"},
    )
    op_timeout_s: float = field(
        default=10.0,
        metadata={
            "minimum": 0.001,
            "help": "every op completes (as a failure or miss) within this",
        },
    )
    lookup_timeout_s: float = field(
        default=1.0,
        metadata={
            "minimum": 0.001,
            "help": "every lookup (EXISTS) completes within this; the gateway answers lookups "
            "from memory in microseconds, so one that takes longer finds it hung, and its keys "
            "are misses rather than a stalled vLLM request",
        },
    )
    reconnect_interval_s: float = field(
        default=0.5,
        metadata={
            "minimum": 0.01,
            "help": "the first pause between attempts to reach a gateway that is down; each "
            "pause is random, in a window that doubles up to reconnect_interval_max_s",
        },
    )
    reconnect_interval_max_s: float = field(
        default=5.0,
        metadata={"minimum": 0.01, "help": "the longest pause between attempts to reconnect"},
    )
    zero_copy: bool = field(
        default=True,
        metadata={
            "help": "when LMCache's L1 is shared memory (lmcache server --shm-name), write "
            "stores of whole pages to the disk straight from L1 (loads always go through the "
            "transfer window)"
        },
    )
    copy_threads: int = field(
        default=4,
        metadata={
            "minimum": 1,
            "help": "threads that copy objects between L1 and the transfer window (a large "
            "object is split over them)",
        },
    )
    pending_store_bytes_max: int = field(
        default=256 * 2**20,
        metadata={
            "minimum": 0,
            "help": "bytes of stores waiting for room in the gateway's session; beyond it new "
            "stores fail at once (LMCache keeps the chunks in L1) instead of holding its buffers",
        },
    )
    pending_ops_max: int = field(
        default=65536,
        metadata={
            "minimum": 1,
            "help": "objects waiting for ring slots; beyond it new ops fail at once",
        },
    )


def parse(params: Mapping[str, Any]) -> ADPParams:
    return fields.build(ADPParams, params, where="lmcache_adp adapter_params")


def socket_path(params: ADPParams) -> str:
    return params.socket_path or default_socket_path()
