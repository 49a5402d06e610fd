"""Goal: the wheel holds every package of the product. pyproject.toml lists them one by one
(setuptools' ``packages``), so a new subpackage left out of that list would install a gateway
that cannot import itself (the container test once found it so); this checks the list."""

from __future__ import annotations

import tomllib

from tests.support import ROOT

PRODUCT = ("adp_wire", "lmcache_adp", "adp_gateway")


def test_every_product_package_is_in_the_wheel() -> None:
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for top in PRODUCT
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert found <= listed, f"add {sorted(found - listed)} to [tool.setuptools] packages"
    assert listed <= found, f"no such packages: {sorted(listed - found)}"
