"""Goal: imports flow one way. The plugin uses only the gateway's wire-level modules, and the
gateway's lower layers never import the upper ones."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_MAY_USE = {
    "gateway.checksum",  # zero-copy ops exchange payload checksums
    "gateway.fragmenter",  # ... one per fragment, split as the gateway splits
    "gateway.protocol",
    "gateway.ring.layout",
    "gateway.ring.queue",
    "gateway.errors",
    "gateway.fields",
    "gateway.units",
    "gateway.tenants",  # the token file format
}
# A module may import only modules of a strictly lower layer.
LAYERS = [
    {"gateway.errors", "gateway.checksum"},
    {"gateway.units"},
    {"gateway.fields", "gateway.ring.layout"},
    {"gateway.ring.queue", "gateway.protocol", "gateway.format", "gateway.l1"},
    {
        "gateway.footer",
        "gateway.fragmenter",
        "gateway.metrics",
        "gateway.status",
        "gateway.verify",
        "gateway.tenants",
        "gateway.backends.base",
        "gateway.backends.memory",
        "gateway.backends.filedevice",
    },
    {
        "gateway.backends.groupsync",
        "gateway.backends.regionscan",
        "gateway.backends.faulty",
        "gateway.backends.preparer",
        "gateway.health",
    },
    {"gateway.backends.regions"},
    {"gateway.backends.regionlog", "gateway.check"},
    {"gateway.index", "gateway.tombstones"},
    {"gateway.store", "gateway.scheduler", "gateway.config"},
    {"gateway.session"},
    {"gateway.service"},
    {"gateway.__main__"},
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
    return {n for n in names if n.split(".")[0] in ("gateway", "lmcache_adp")}


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def known(names: set[str]) -> set[str]:
    modules = {module_name(p) for p in ROOT.glob("gateway/**/*.py")}
    return {n for n in names if n in modules}


def test_plugin_imports_only_the_wire_modules_of_the_gateway() -> None:
    for path in ROOT.glob("lmcache_adp/*.py"):
        used = {n for n in known(imports_of(path)) if n.startswith("gateway.")}
        assert used <= PLUGIN_MAY_USE, f"{path.name} imports {used - PLUGIN_MAY_USE}"


def test_gateway_layers_import_downward_only() -> None:
    level = {name: i for i, layer in enumerate(LAYERS) for name in layer}
    for path in ROOT.glob("gateway/**/*.py"):
        name = module_name(path)
        if name.endswith("__init__") or name in ("gateway", "gateway.ring", "gateway.backends"):
            continue
        assert name in level, f"{name} is missing from LAYERS"
        for used in known(imports_of(path)) - {"gateway", "gateway.ring", "gateway.backends"}:
            assert level[used] < level[name], (
                f"{name} (layer {level[name]}) imports {used} (layer {level[used]})"
            )
