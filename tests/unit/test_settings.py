"""Goal: configs and adapter params are checked field by field, with errors that name the field,
and the documented files (gateway.yaml, plugin_manifest.yaml) agree with the code."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from adp_gateway import config as gateway_config
from adp_gateway.config import GatewayConfig
from adp_gateway.errors import ConfigError, StartupError
from adp_wire import settings
from adp_wire.units import parse_size
from lmcache_adp.config import ADPParams, parse

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4096", 4096),
        ("64GiB", 64 * 2**30),
        ("512 MiB", 512 * 2**20),
        ("1.5GB", 1_500_000_000),
        ("4k", 4096),
        (123, 123),
    ],
)
def test_sizes_parse(text: str | int, expected: int) -> None:
    assert parse_size(text, "capacity") == expected


@pytest.mark.parametrize("text", ["", "lots", "12XB", "-4", True, -1])
def test_bad_sizes_name_the_field(text: str | int) -> None:
    with pytest.raises(ConfigError, match="capacity"):
        parse_size(text, "capacity")


def test_unknown_param_is_named_with_a_suggestion() -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'socketpath'.*did you mean 'socket_path'"):
        parse({"socketpath": "/x"})


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("op_timeout_s", "10"),
        ("op_timeout_s", True),
        ("tenant", 3),
        ("pending_ops_max", 1.5),
        ("op_timeout_s", 0),
        ("op_timeout_s", float("inf")),
        ("lookup_timeout_s", float("nan")),
        ("socket_path", 7),
        ("gateway_uids", ["root"]),
    ],
)
def test_mistyped_param_is_named(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"adapter_params.{key}"):
        parse({key: value})


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("socket_path", "", "is empty: give the gateway's socket path, or null"),
        ("op_timeout_s", 1000, "must be at most 120, got 1000: LMCache's L1 locks expire"),
        ("op_timeout_s", 301.0, "must be at most 120"),
        ("tenant", "", "must be 1 to 64 bytes"),
        ("tenant", "t" * 65, "must be 1 to 64 bytes (UTF-8), got 65"),
        ("tenant", "é" * 33, "got 66"),  # bytes, as the handshake counts them
    ],
)
def test_params_that_would_fail_later_are_refused_at_once(
    key: str, value: object, says: str
) -> None:
    """An empty socket path silently meant the default socket; an op timeout past LMCache's
    L1 lock TTL let a buffer be reused under an op; a tenant name the handshake refuses failed
    only at connect time. Each is now one line at construction, naming the fix."""
    with pytest.raises(ConfigError, match=f"adapter_params.{key}: ") as raised:
        parse({key: value})
    assert says in str(raised.value)


def test_params_at_their_limits_are_accepted() -> None:
    params = parse({"op_timeout_s": 120, "tenant": "t" * 64, "socket_path": None})
    assert params.op_timeout_s == 120 and len(params.tenant) == 64


def test_ints_are_accepted_for_floats() -> None:
    assert parse({"op_timeout_s": 3}).op_timeout_s == 3.0


def test_a_single_value_is_a_list_of_one() -> None:
    assert parse({"gateway_uids": 0}).gateway_uids == [0]


def test_a_retired_param_says_what_replaced_it() -> None:
    with pytest.raises(
        ConfigError,
        match=r"'pending_store_bytes_max' is no longer a setting: .*"
        r"wait .* until their deadline",
    ):
        parse({"pending_store_bytes_max": 2**20})


def test_an_unknown_param_lists_the_known_ones_even_without_a_close_match() -> None:
    with pytest.raises(ConfigError) as info:
        parse({"colour": "blue"})
    assert str(info.value).startswith("lmcache_adp: adapter_params: unknown key 'colour' (")
    assert "did you mean" not in str(info.value) and "op_timeout_s" in str(info.value)


def test_manifest_documents_exactly_the_params_with_their_defaults() -> None:
    manifest = yaml.safe_load((ROOT / "plugin_manifest.yaml").read_text())
    assert manifest["type"] == "native_plugin"
    assert manifest["module_path"] == "lmcache_adp"
    assert manifest["class_name"] == "ADPConnector"
    assert {"lmcache", "vllm"} <= set(manifest["supported_versions"])
    documented = {k: (v["type"], v["default"]) for k, v in manifest["adapter_params"].items()}
    assert documented == settings.describe(ADPParams)
    for key, (_, default) in documented.items():  # every documented param is accepted as such
        assert getattr(parse({key: default}), key) == default
    assert all(v["description"] for v in manifest["adapter_params"].values())


def test_gateway_yaml_documents_every_key_with_the_defaults() -> None:
    text = (ROOT / "configs" / "gateway.yaml").read_text()
    documented = yaml.safe_load(text)
    names = list(GatewayConfig.model_fields)
    assert sorted(documented) == sorted(names)
    loaded = gateway_config.load(str(ROOT / "configs" / "gateway.yaml"), {})
    assert loaded == GatewayConfig()
    for name in names:  # each key has a comment line right above it
        before = text.split(f"\n{name}:")[0].rstrip().splitlines()[-1]
        assert before.startswith("#"), name


def test_operations_guide_names_the_default_sync_policy_the_code_has() -> None:
    """docs/operations.md's sync table marks one policy "(default)"; it said `always` while
    the code, the README and configs/gateway.yaml said `periodic`."""
    text = (ROOT / "docs" / "operations.md").read_text()
    table = text.split("### Sync policy", 1)[1].split("\n\n", 2)[1]
    defaults = [row.split("`")[1] for row in table.splitlines() if "(default)" in row]
    assert defaults == [GatewayConfig().sync]


def test_flags_override_the_file(tmp_path: Path) -> None:
    path = tmp_path / "g.yaml"
    path.write_text("capacity: 8GiB\nsocket: /tmp/a.sock\nio_threads: 2\n")
    config = gateway_config.load(
        str(path), {"socket": "/tmp/b.sock", "capacity": None, "data_dirs": "/data"}
    )
    assert (config.socket, config.capacity, config.io_threads) == ("/tmp/b.sock", 8 * 2**30, 2)
    assert config.data_dirs == ["/data"]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("fragment_size: 5000\n", "multiple of 4 KiB"),
        ("fragment_size: 64MiB\n", "must fit in region_size"),
        ("sync: sometimes\n", "sync"),
        ("io_threads: 0\n", "io_threads: must be at least 1"),
        ("io_threads: '8'\n", "io_threads: expected an integer, got string '8': write it without"),
        ("sync: sometimes\n", "sync: 'sometimes' is not a choice: write 'always', 'periodic' or"),
        ("capacity: -1\n", "capacity: a size cannot be negative"),
        ("region_size: 4096\n", "region_size: must be at least 8192, got 4096"),
        ("tenants: [{name: a, uids: [1], quota: 2 gigs}]\n", r"tenants\[0\]\.quota: cannot read"),
        ("tenants: [{name: a, uid: 1}]\n", r"tenants\[0\]: unknown key 'uid'; did you mean 'uids'"),
        ("devices: [1]\n", r"devices\[0\]: expected a string, got integer 1"),
        ("write_budget: []\n", r"write_budget: expected a string or an integer, got list \[\]$"),
        ("- a\n- b\n", "mapping"),
        ("capacity: [1\n", "not valid YAML"),
    ],
)
def test_bad_config_files_are_named(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "g.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        gateway_config.load(str(path), {})


def test_a_bad_flag_is_blamed_on_the_command_line_not_the_file(tmp_path: Path) -> None:
    path = tmp_path / "g.yaml"
    path.write_text("capacity: 8GiB\n")
    with pytest.raises(ConfigError, match=r"^command line: capacity: cannot read 'lots'"):
        gateway_config.load(str(path), {"capacity": "lots"})


def test_unwritable_data_dir_is_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    config = gateway_config.load(None, {"data_dirs": str(blocker / "data")})
    with pytest.raises(StartupError, match=r"cannot create data dir .*--data-dir"):
        gateway_config.resolve_capacity(config)


def test_capacity_above_free_space_is_refused(tmp_path: Path) -> None:
    config = gateway_config.load(None, {"data_dirs": str(tmp_path), "capacity": "900TiB"})
    with pytest.raises(StartupError, match=r"capacity is 900.0 TiB but .* lower `capacity`"):
        gateway_config.resolve_capacity(config)


def test_default_capacity_is_derived_from_free_space(tmp_path: Path) -> None:
    config = gateway_config.resolve_capacity(
        gateway_config.load(None, {"data_dirs": str(tmp_path)})
    )
    assert config.capacity is not None
    assert 0 < config.capacity <= gateway_config.AUTO_CAPACITY_BYTES_MAX


def test_the_memory_card_takes_its_capacity_from_the_config_never_from_the_disk(
    tmp_path: Path,
) -> None:
    unset = gateway_config.load(None, {"card": "memory", "data_dirs": [str(tmp_path)]})
    with pytest.raises(ConfigError, match="capacity: the memory card holds its values in RAM"):
        gateway_config.resolve_capacity(unset)
    huge = unset.model_copy(update={"capacity": 2**50})  # far past the disk, none of its concern
    assert gateway_config.resolve_capacity(huge).capacity == 2**50
