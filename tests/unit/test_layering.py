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
    {"adp_wire.errors"},
    {
        "adp_wire.checksum",
        "adp_wire.fragmenter",
        "adp_wire.trace",
        "adp_wire.ring.doorbell",
        "adp_wire.sealed",
        "adp_wire.threads",
        "adp_wire.peer",
    },
    {"adp_wire.units", "adp_wire.tokens", "adp_wire.ring.layout", "adp_wire.presence"},
    {"adp_wire.ring.queue", "adp_wire.protocol", "adp_wire.settings"},
    {"adp_wire.__main__"},
]
GATEWAY_LAYERS = [
    # Leaves: errors, the record format, a device's interface, what a session counts.
    {
        "adp_gateway.errors",
        "adp_gateway.card.holdings",
        "adp_gateway.card.software.format",
        "adp_gateway.card.software.devices.base",
        "adp_gateway.card.software.devices.memory",
        "adp_gateway.host.hugepages",
        "adp_gateway.host.priority",
        "adp_gateway.objects.names",
        "adp_gateway.sessions.presence",
        "adp_gateway.sessions.summary",
        "adp_gateway.scheduling.loads",
        "adp_gateway.scheduling.periodic_sync",
        "adp_gateway.scheduling.write_depth",
        # Policies decide and do no I/O: the gateway and bench/trace_sim.py run them alike.
        "adp_gateway.policy.budget",
        "adp_gateway.policy.sightings",
        "adp_gateway.policy.store_rate",
        "adp_gateway.card.software.eviction_ages",
        "adp_gateway.card.software.victims",
    },
    # The card seam (card/base.py), the devices, observability, the client's memory.
    {
        "adp_gateway.card.base",
        "adp_gateway.card.software.devices.faulty",
        "adp_gateway.card.software.devices.filedevice",
        "adp_gateway.card.software.devices.groupsync",
        "adp_gateway.card.software.devices.health",
        "adp_gateway.card.software.devices.preparer",
        "adp_gateway.card.software.devices.reader",
        "adp_gateway.front.tenants",
        "adp_gateway.objects.catalog",
        "adp_gateway.objects.census",
        "adp_gateway.observe.metrics",
        "adp_gateway.observe.status",
        "adp_gateway.observe.verify",
        "adp_gateway.sessions.client_l1",
        "adp_gateway.sessions.client_process",
        "adp_gateway.scheduling.scheduler",
    },
    {
        "adp_gateway.config",
        "adp_gateway.card.memory",
        "adp_gateway.card.software.settings",
        "adp_gateway.card.software.superblocks",
        "adp_gateway.front.handshake_slots",
        "adp_gateway.front.refusals",
        "adp_gateway.scheduling.io_threads",
        "adp_gateway.sessions.extents",
    },
    {
        "adp_gateway.card.software.formatting",
        "adp_gateway.policy.admission",
        "adp_gateway.card.software.regions",
        "adp_gateway.front.unix_socket",
        "adp_gateway.host.footprint",
    },
    # The software card, one module per concern (docs/design.md, "The card seam").
    {
        "adp_gateway.card.software.eviction",
        "adp_gateway.card.software.index",
        "adp_gateway.card.software.preparation",
        "adp_gateway.card.software.sealing",
        "adp_gateway.card.software.tombstones",
    },
    {"adp_gateway.card.software.pools"},
    {"adp_gateway.card.software.records", "adp_gateway.card.software.recovery"},
    {"adp_gateway.card.software.check", "adp_gateway.card.software.regionlog"},
    {"adp_gateway.card.software.catalog", "adp_gateway.card.software.values"},
    {"adp_gateway.card.software.card"},
    {"adp_gateway.card.loader"},  # the one module above card/software that names it
    # Objects over the card, the sessions' work, the sessions, the front door, the process.
    {"adp_gateway.objects.store"},
    {"adp_gateway.scheduling.tasks"},
    {"adp_gateway.sessions.session"},
    {"adp_gateway.front.reception"},
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
    "adp_gateway.front",
    "adp_gateway.sessions",
    "adp_gateway.scheduling",
    "adp_gateway.observe",
    "adp_gateway.host",
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


def test_nothing_above_the_card_reaches_into_the_software_card() -> None:
    """The card seam holds: the gateway above card/ talks to a card through card/base.py
    only, and card/loader.py alone names the software card (a vendor's card is one more
    implementation, not a change above the seam)."""
    for name, path in modules("adp_gateway"):
        if name.startswith("adp_gateway.card.software") or name == "adp_gateway.card.loader":
            continue
        inside = sorted(n for n in imports_of(path) if n.startswith("adp_gateway.card.software"))
        assert not inside, f"{name} imports {inside}: reach the card through card/base.py"


def test_the_seam_names_nothing_of_a_card_or_the_gateway_above_it() -> None:
    """card/base.py types only what it owns: no card's devices, no gateway settings."""
    used = known(imports_of(ROOT / "adp_gateway/card/base.py"), "adp_gateway")
    assert used <= {"adp_gateway.card.holdings", "adp_gateway.errors"}, sorted(used)


def test_no_two_classes_share_a_name() -> None:
    """One name, one thing (STYLE.md 8a): a class name says which thing it is, in every
    package of the product."""
    seen: dict[str, str] = {}
    for package in PRODUCT:
        for name, path in modules(package):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    other = seen.setdefault(node.name, name)
                    assert other == name, f"class {node.name} is in {other} and in {name}"


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
