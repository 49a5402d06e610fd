"""The plugin's ``adapter_params``, checked field by field (adp_wire/settings.py).

plugin_manifest.yaml documents the same fields; tests/unit/test_settings.py keeps them in step.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import Field

from adp_wire.protocol import default_socket_path
from adp_wire.settings import OneOrMany, Settings, build


class ADPParams(Settings):
    retired: ClassVar[dict[str, str]] = {
        "pending_store_bytes_max": "stores now wait for room in the session until their "
        "deadline (op_timeout_s) instead of failing at once; remove the key",
    }

    socket_path: str | None = Field(
        default=None,
        description="Unix socket of the gateway (adp-gateway serve --socket); null: the "
        "gateway's default (adp_wire.protocol.default_socket_path)",
    )
    gateway_uids: OneOrMany[int] | None = Field(
        default=None,
        description="uids the gateway may run as; the plugin refuses any other listener, and "
        "a socket directory anyone else can write; root always counts. null: the plugin's own "
        "user",
    )
    tenant: str = Field(
        default="default",
        description="tenant name sent at the handshake; objects are namespaced by it",
    )
    token_file: str | None = Field(
        default=None,
        description="file holding the tenant's secret token, if its gateway asks for one",
    )
    op_timeout_s: float = Field(
        default=10.0,
        ge=0.001,
        description="every op completes (as a failure or miss) within this",
    )
    lookup_timeout_s: float = Field(
        default=1.0,
        ge=0.001,
        description="every lookup (EXISTS) completes within this; the gateway answers lookups "
        "from memory in microseconds, so one that takes longer finds it hung, and its keys are "
        "misses rather than a stalled vLLM request",
    )
    reconnect_interval_s: float = Field(
        default=0.5,
        ge=0.01,
        description="the first pause between attempts to reach a gateway that is down; each "
        "pause is random, in a window that doubles up to reconnect_interval_max_s",
    )
    reconnect_interval_max_s: float = Field(
        default=5.0, ge=0.01, description="the longest pause between attempts to reconnect"
    )
    zero_copy: bool = Field(
        default=True,
        description="when LMCache's L1 is shared memory (lmcache server --shm-name), write "
        "stores of whole pages to the disk straight from L1 (loads always go through the "
        "transfer window)",
    )
    remote_copy: bool = Field(
        default=True,
        description="when LMCache's L1 is private memory, let the gateway copy each store out "
        "of it itself (process_vm_readv; the kernel must let the gateway read this process: "
        "the same user, and under Yama ptrace_scope 1 the plugin names the gateway's pid with "
        "PR_SET_PTRACER), so no store is copied inside LMCache's process; where the kernel "
        "refuses, stores are copied here (loads always are)",
    )
    copy_threads: int | None = Field(
        default=None,
        ge=1,
        description="threads that copy objects between L1 and the transfer window (a large "
        "object is split over them); null: half the CPUs LMCache may run on, 1 to 4, so copies "
        "never take every core from LMCache's own threads and the link's",
    )
    pending_ops_max: int = Field(
        default=2**20,
        ge=1,
        description="objects waiting for ring slots (each costs the plugin about 100 bytes; "
        "LMCache's L1 holds their bytes); beyond it new ops fail at once",
    )


def parse(params: Mapping[str, Any]) -> ADPParams:
    return build(ADPParams, params, where="lmcache_adp", root="adapter_params")


def copy_threads(params: ADPParams) -> int:
    if params.copy_threads is not None:
        return params.copy_threads
    return min(4, max(1, len(os.sched_getaffinity(0)) // 2))


def socket_path(params: ADPParams) -> str:
    return params.socket_path or default_socket_path()
