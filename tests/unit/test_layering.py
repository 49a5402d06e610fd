"""Goal: imports flow one way. The plugin uses only the gateway's wire-level modules, and the
gateway's lower layers never import the upper ones."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_MAY_USE = {
    "adp_gateway.checksum",  # zero-copy ops exchange payload checksums
    "adp_gateway.fragmenter",  # ... one per fragment, split as the gateway splits
    "adp_gateway.protocol",
    "adp_gateway.ring.layout",
    "adp_gateway.ring.queue",
    "adp_gateway.errors",
    "adp_gateway.units",
    "adp_wire.settings",
    "adp_gateway.tenants",  # the token file format
}
# A module may import only modules of a strictly lower layer.
LAYERS = [
    {"adp_gateway.errors", "adp_gateway.checksum"},
    {"adp_gateway.units"},
    {"adp_wire.settings", "adp_gateway.ring.layout"},
    {"adp_gateway.ring.queue", "adp_gateway.protocol", "adp_gateway.format", "adp_gateway.l1"},
    {
        "adp_gateway.footer",
        "adp_gateway.fragmenter",
        "adp_gateway.metrics",
        "adp_gateway.status",
        "adp_gateway.verify",
        "adp_gateway.tenants",
        "adp_gateway.backends.base",
        "adp_gateway.backends.memory",
        "adp_gateway.backends.filedevice",
    },
    {
        "adp_gateway.backends.groupsync",
        "adp_gateway.backends.regionscan",
        "adp_gateway.backends.faulty",
        "adp_gateway.backends.preparer",
        "adp_gateway.health",
    },
    {"adp_gateway.backends.regions"},
    {"adp_gateway.backends.regionlog", "adp_gateway.check"},
    {"adp_gateway.index", "adp_gateway.tombstones"},
    {"adp_gateway.store", "adp_gateway.scheduler", "adp_gateway.config"},
    {"adp_gateway.session"},
    {"adp_gateway.service"},
    {"adp_gateway.__main__"},
]


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return {n for n in names if n.split(".")[0] in ("adp_gateway", "adp_wire", "lmcache_adp")}


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def known(names: set[str]) -> set[str]:
    modules = {module_name(p) for p in ROOT.glob("adp_*/**/*.py")}
    return {n for n in names if n in modules}


def test_plugin_imports_only_the_wire_modules_of_the_gateway() -> None:
    for path in ROOT.glob("lmcache_adp/*.py"):
        used = {n for n in known(imports_of(path)) if n.startswith(("adp_gateway.", "adp_wire."))}
        assert used <= PLUGIN_MAY_USE, f"{path.name} imports {used - PLUGIN_MAY_USE}"


def test_gateway_layers_import_downward_only() -> None:
    level = {name: i for i, layer in enumerate(LAYERS) for name in layer}
    for path in ROOT.glob("adp_*/**/*.py"):
        name = module_name(path)
        if name.endswith("__init__") or name in (
            "adp_gateway",
            "adp_wire",
            "adp_gateway.ring",
            "adp_gateway.backends",
        ):
            continue
        assert name in level, f"{name} is missing from LAYERS"
        for used in known(imports_of(path)) - {
            "adp_gateway",
            "adp_gateway.ring",
            "adp_gateway.backends",
        }:
            assert level[used] < level[name], (
                f"{name} (layer {level[name]}) imports {used} (layer {level[used]})"
            )
