"""The plugin's ``adapter_params``, checked field by field (adp_wire/settings.py).

plugin_manifest.yaml documents the same fields; tests/unit/test_settings.py keeps them in step.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar

from pydantic import Field

from adp_wire.protocol import TENANT_BYTES_MAX, default_socket_path
from adp_wire.settings import OneOrMany, Settings, build, checked

# LMCache's L1 locks expire after --l1-read-ttl-seconds (300 by default): past it LMCache may
# hand an L1 buffer to another use while an op of ours still holds it. An op must end well
# before that, its grace (the copy slices in progress) included.
L1_LOCK_TTL_S = 300.0
OP_TIMEOUT_MAX_S = 120.0


def _socket_path_problem(path: str | None) -> str | None:
    if path == "":
        return "is empty: give the gateway's socket path, or null for its default"
    return None


def _tenant_problem(tenant: str) -> str | None:
    if not 0 < len(tenant.encode()) <= TENANT_BYTES_MAX:
        return (
            f"must be 1 to {TENANT_BYTES_MAX} bytes (UTF-8), got {len(tenant.encode())}: "
            "use the name of a tenant the gateway config declares"
        )
    return None


def _op_timeout_problem(seconds: float) -> str | None:
    if seconds > OP_TIMEOUT_MAX_S:
        return (
            f"must be at most {OP_TIMEOUT_MAX_S:g}, got {seconds:g}: LMCache's L1 locks expire "
            f"after {L1_LOCK_TTL_S:g} s (--l1-read-ttl-seconds), and past them an L1 buffer "
            "can be reused while an op still holds it"
        )
    return None


class ADPParams(Settings):
    retired: ClassVar[dict[str, str]] = {
        "pending_store_bytes_max": "stores now wait for room in the session until their "
        "deadline (op_timeout_s) instead of failing at once; remove the key",
    }

    socket_path: Annotated[str | None, checked(_socket_path_problem)] = Field(
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
    tenant: Annotated[str, checked(_tenant_problem)] = Field(
        default="default",
        description="tenant name sent at the handshake; objects are namespaced by it",
    )
    token_file: str | None = Field(
        default=None,
        description="file holding the tenant's secret token, if its gateway asks for one",
    )
    op_timeout_s: Annotated[float, checked(_op_timeout_problem)] = Field(
        default=10.0,
        ge=0.001,
        description="every op completes (as a failure or miss) within this; at most 120, "
        "well under LMCache's 300 s L1 lock TTL",
    )
    lookup_timeout_s: Annotated[float, checked(_op_timeout_problem)] = Field(
        default=1.0,
        ge=0.001,
        description="every lookup (EXISTS) completes within this (at most 120, as "
        "op_timeout_s); the gateway answers lookups "
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
