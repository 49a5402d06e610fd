"""Goal: settings from untrusted input (the plugin's adapter_params, from LMCache's JSON; the
gateway's YAML) either build or raise one ConfigError line that names the key at fault, for any
input: adp_wire.settings turns every kind of pydantic error into such a line, and never fails
some other way."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from adp_gateway.config import GatewayConfig
from adp_gateway.errors import ConfigError
from adp_gateway.front.tenants import TenantConfig
from adp_wire.settings import build
from lmcache_adp.config import ADPParams, parse

# What JSON and YAML can carry, with the values that sit on the validators' edges.
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([0, -1, 1, 4096, 2**64])
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(["64GiB", "512 MiB", "1.5GB", "-4", "lots", "4096", "true", "periodic"])
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)


def keys_of(fields: list[str]) -> st.SearchStrategy[str]:
    """Mostly the known keys, some with a typo, some anything."""
    typos = [k[:-1] for k in fields] + [k.replace("_", "") for k in fields]
    return st.sampled_from(fields) | st.sampled_from(typos) | st.text(max_size=10)


def tenant() -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(keys_of(list(TenantConfig.model_fields)), VALUES, max_size=4)


GATEWAY_VALUES = VALUES | st.lists(tenant() | VALUES, max_size=3)


def assert_names_a_key(message: str, start: str, values: dict[str, Any]) -> None:
    assert "\n" not in message, message
    assert message.startswith(start), message
    assert any(repr(k) in message or f"{k}:" in message or f"{k}[" in message for k in values), (
        message
    )


@given(st.dictionaries(keys_of(list(ADPParams.model_fields)), VALUES, max_size=4))
def test_adapter_params_build_or_name_the_key(values: dict[str, Any]) -> None:
    try:
        parse(values)
    except ConfigError as exc:
        assert_names_a_key(str(exc), "lmcache_adp: adapter_params", values)


@given(st.dictionaries(keys_of(list(GatewayConfig.model_fields)), GATEWAY_VALUES, max_size=4))
def test_gateway_config_builds_or_names_the_key(values: dict[str, Any]) -> None:
    try:
        build(GatewayConfig, values, "g.yaml")
    except ConfigError as exc:
        assert_names_a_key(str(exc), "g.yaml: ", values)
