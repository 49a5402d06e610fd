"""Goal: imports flow one way. The plugin (lmcache_adp) and the gateway (adp_gateway) share the
contract package adp_wire and import nothing of each other; adp_wire imports neither; inside
each package, modules import only lower layers. Test modules import no other test module (shared
helpers live in tests/support), and bench/ uses product code and tests/support only."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("adp_wire", "adp_gateway", "lmcache_adp")
PLUGIN_MAY_USE: set[str] = set()  # everything the plugin shares is in adp_wire
# A module may import only modules of a strictly lower layer of its own package.
WIRE_LAYERS = [
    {
        "adp_wire.errors",
        "adp_wire.checksum",
        "adp_wire.fragmenter",
        "adp_wire.trace",
        "adp_wire.ring.doorbell",
        "adp_wire.threads",
    },
    {"adp_wire.units", "adp_wire.tokens", "adp_wire.ring.layout", "adp_wire.presence"},
    {"adp_wire.ring.queue", "adp_wire.protocol", "adp_wire.settings"},
    {"adp_wire.__main__"},
]
GATEWAY_LAYERS = [
    {"adp_gateway.errors"},
    {
        "adp_gateway.format",
        "adp_gateway.l1",
        "adp_gateway.hugepages",
        "adp_gateway.priority",
        "adp_gateway.summary",
        "adp_gateway.objects.names",
        # Policies decide and do no I/O: the gateway and bench/trace_sim.py run them alike.
        "adp_gateway.policy.sightings",
        "adp_gateway.policy.budget",
        "adp_gateway.policy.pressure",
        "adp_gateway.policy.victims",
    },
    {
        "adp_gateway.metrics",
        "adp_gateway.status",
        "adp_gateway.verify",
        "adp_gateway.tenants",
        "adp_gateway.presence",
        "adp_gateway.card.holdings",
        "adp_gateway.card.software.devices.base",
        "adp_gateway.card.software.devices.memory",
        "adp_gateway.card.software.devices.filedevice",
    },
    {
        "adp_gateway.card.software.devices.groupsync",
        "adp_gateway.card.software.devices.reader",
        "adp_gateway.card.software.devices.faulty",
        "adp_gateway.card.software.devices.preparer",
        "adp_gateway.health",
        "adp_gateway.config",
    },
    # The card seam: the key-value surface every card implements; the object store above
    # (adp_gateway.objects) talks only to it, and the loader picks the card.
    {"adp_gateway.card.base", "adp_gateway.policy.admission"},
    # The software card, one module per concern (docs/design.md, "The card seam").
    {"adp_gateway.card.software.regions"},
    {
        "adp_gateway.card.software.sealing",
        "adp_gateway.card.software.eviction",
        "adp_gateway.card.software.index",
        "adp_gateway.card.software.tombstones",
    },
    {"adp_gateway.card.software.pools", "adp_gateway.card.software.preparation"},
    {"adp_gateway.card.software.records", "adp_gateway.card.software.recovery"},
    {"adp_gateway.card.software.regionlog", "adp_gateway.check"},
    {
        "adp_gateway.card.software.values",
        "adp_gateway.card.software.catalog",
        "adp_gateway.scheduler",
    },
    {"adp_gateway.card.memory", "adp_gateway.card.software.card"},
    {"adp_gateway.card.loader", "adp_gateway.objects.catalog"},
    # Objects over the card: what the gateway's sessions store through.
    {"adp_gateway.objects.store"},
    {"adp_gateway.loads", "adp_gateway.extents"},
    {"adp_gateway.work"},
    {"adp_gateway.session", "adp_gateway.unix_socket"},
    {"adp_gateway.reception"},
    {"adp_gateway.service"},
    {"adp_gateway.__main__"},
]
PACKAGES = {
    "adp_wire",
    "adp_wire.ring",
    "adp_gateway",
    "adp_gateway.card",
    "adp_gateway.card.software",
    "adp_gateway.card.software.devices",
    "adp_gateway.objects",
    "adp_gateway.policy",
}


def imports_of(path: Path) -> set[str]:
    """Every module name an import in ``path`` names, with ``from m import n`` giving both
    ``m`` and ``m.n`` (``n`` may be a submodule). Imports inside functions count too."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def modules(*folders: str) -> Iterator[tuple[str, Path]]:
    for folder in folders:
        for path in sorted(ROOT.glob(f"{folder}/**/*.py")):
            yield module_name(path), path


def known(names: set[str], package: str) -> set[str]:
    """The names that are modules of ``package`` (not classes or functions imported from one)."""
    ours = {name for name, _ in modules(package)}
    return {n for n in names if n in ours} - PACKAGES


def top(names: set[str]) -> set[str]:
    return {n.split(".")[0] for n in names}


def test_the_plugin_imports_only_the_contract_of_the_gateway() -> None:
    for name, path in modules("lmcache_adp"):
        used = {n for n in imports_of(path) if n.split(".")[0] == "adp_gateway"} - {"adp_gateway"}
        other = {n for n in used if not any(n.startswith(m) for m in PLUGIN_MAY_USE)}
        assert not other, f"{name} imports {sorted(other)}: use adp_wire"


def test_the_gateway_never_imports_the_plugin() -> None:
    for name, path in modules("adp_gateway"):
        assert "lmcache_adp" not in top(imports_of(path)), name


def test_the_contract_imports_neither_side() -> None:
    for name, path in modules("adp_wire"):
        used = top(imports_of(path)) & {"adp_gateway", "lmcache_adp", "tests", "bench"}
        assert not used, f"{name} imports {sorted(used)}"


def check_layers(package: str, layers: list[set[str]]) -> None:
    level = {name: i for i, layer in enumerate(layers) for name in layer}
    for name, path in modules(package):
        if name in PACKAGES:
            continue
        assert name in level, f"{name} is missing from the layers of {package}"
        for used in known(imports_of(path), package):
            assert level[used] < level[name], (
                f"{name} (layer {level[name]}) imports {used} (layer {level[used]})"
            )


def test_the_contract_layers_import_downward_only() -> None:
    check_layers("adp_wire", WIRE_LAYERS)


def test_the_gateway_layers_import_downward_only() -> None:
    check_layers("adp_gateway", GATEWAY_LAYERS)


def test_test_modules_import_only_shared_helpers_of_tests() -> None:
    """No test module imports another (nor a helper inside another test folder): whatever two
    of them share lives in tests/support, which imports no test module either."""
    for name, path in modules("tests"):
        used = {n for n in imports_of(path) if n.split(".")[0] == "tests"}
        outside = {n for n in used if n != "tests" and not n.startswith("tests.support")}
        assert not outside, f"{name} imports {sorted(outside)}: move what it needs to tests/support"


def test_bench_imports_only_product_code_and_test_support() -> None:
    for name, path in modules("bench"):
        used = {n for n in imports_of(path) if n.split(".")[0] == "tests"}
        outside = {n for n in used if n != "tests" and not n.startswith("tests.support")}
        assert not outside, f"{name} imports {sorted(outside)}: only tests.support is shared"


def test_no_name_in_tests_support_hides_one_of_its_modules() -> None:
    """``import tests.support.X`` sets the attribute X of tests.support to the module, so a
    function or class of the same name in tests/support/__init__.py would be replaced by it as
    soon as any test imports that module (and ``from tests.support import X`` would then give
    the module instead)."""
    init = ROOT / "tests/support/__init__.py"
    defined = set()
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined.update(t.id for t in node.targets if isinstance(t, ast.Name))
    submodules = {p.stem for p in init.parent.glob("*.py")} - {"__init__"}
    assert not defined & submodules, f"rename {sorted(defined & submodules)} in tests/support"
