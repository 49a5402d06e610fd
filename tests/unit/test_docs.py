"""Goal: what the docs state about the code is what the code does, where a statement can be
checked without running a stack (tests/integration/test_serve_script.py and
test_dashboard.py check the running ones): defaults, versions, ports and names. And no tracked
file points outside the repository, where a reader of a clone cannot follow, and every result
the README and docs/ cite is in bench/results/ (tests/unit/test_bench_results.py checks that
each one is as its JSON renders it)."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

from adp_gateway.config import GatewayConfig
from adp_gateway.service import _io_threads_max
from adp_wire.protocol import PROTOCOL_VERSION
from adp_wire.ring.layout import LAYOUT_VERSION

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
OPERATIONS = (ROOT / "docs" / "operations.md").read_text()
# A path into bench/results/, unless it is one of git's, `COMMIT:bench/results/...`: a result
# that has left the tree and that git keeps.
RESULT_PATH = re.compile(r"(?<![0-9a-f]:)bench/results/[\w./-]*")
# Paths into the workspace this project is developed in, which no clone has; written in two
# pieces so that this file does not name them itself.
OUTSIDE = [piece.replace("|", "") for piece in ("../sha|red", "/wo|rk/", "sha|red/reference")]
OUTSIDE += ["sha" + "red/device"]


def tracked_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
    )
    return [ROOT / name for name in listed.stdout.decode().split("\0") if name]


def outside_paths(text: bytes) -> list[str]:
    return [pattern for pattern in OUTSIDE if pattern.encode() in text]


def test_no_tracked_file_names_a_path_outside_the_repository() -> None:
    files = tracked_files()
    assert len(files) > 100
    found = {}
    for path in files:
        if path.is_file() and (named := outside_paths(path.read_bytes())):
            found[str(path.relative_to(ROOT))] = named
    # Bench results record their commands: give paths relative to the repository root.
    assert found == {}
    assert outside_paths(b"see " + OUTSIDE[0].encode() + b"/x.md")  # the check can fail


def table_row(text: str, first_cell: str) -> list[str]:
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no table row starting {first_cell!r}")


def test_the_sync_table_names_the_default_the_code_has() -> None:
    default = GatewayConfig.model_fields["sync"].default
    defaults = re.findall(r"^\| `(\w+)` \(default\) \|", OPERATIONS, re.MULTILINE)
    assert defaults == [default]
    assert f"`{default}` (default)" in README


def test_versions_in_the_docs_are_the_codes() -> None:
    spoken = {int(n) for n in re.findall(r"this gateway speaks (\d+)", OPERATIONS)}
    assert spoken == {PROTOCOL_VERSION}
    assert table_row(OPERATIONS, "wire protocol")[2] == str(PROTOCOL_VERSION)
    assert table_row(OPERATIONS, "shared-memory ring layout")[2] == str(LAYOUT_VERSION)


def test_the_metrics_port_of_the_quick_start_is_serve_sh_default() -> None:
    serve = (ROOT / "scripts" / "serve.sh").read_text()
    found = re.search(r"^METRICS=(\S+)$", serve, re.MULTILINE)
    assert found is not None
    address = found.group(1)
    assert f"curl -s http://{address}/metrics" in README
    assert f"`{address}`" in OPERATIONS


def test_every_dependency_is_named_where_the_install_is_described() -> None:
    with open(ROOT / "pyproject.toml", "rb") as f:
        dependencies = tomllib.load(f)["project"]["dependencies"]
    names = [re.split(r"[<>=!~ ;\[]", requirement)[0] for requirement in dependencies]
    install = OPERATIONS[OPERATIONS.index("The package declares") :][:600]
    assert [name for name in names if f"`{name}" not in install] == []


def missing_results(text: str) -> list[str]:
    """The bench/results/ paths that ``text`` names and the checkout lacks."""
    named = {path.rstrip(".") for path in RESULT_PATH.findall(text)}
    return sorted(path for path in named if not (ROOT / path).exists())


def test_every_result_the_readme_and_docs_cite_is_in_bench_results() -> None:
    cited = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    missing = {p.name: m for p in cited if (m := missing_results(p.read_text()))}
    # A result replaced by a newer run: cite the new file, or drop the figure it gave.
    assert missing == {}
    assert "bench/results/matrix-vm.md" in README  # the README's tables cite the results
    assert missing_results("see bench/results/matrix-full.md.") == ["bench/results/matrix-full.md"]
    assert missing_results("in `a7353c1:bench/results/h200/README.md`") == []  # kept by git


def test_the_readme_first_screen_names_no_commit() -> None:
    """Its first screen is what the product is and how to run it; commits belong to results."""
    first_screen = "\n".join(README.splitlines()[:60])
    assert "scripts/serve.sh" in first_screen and "vllm serve" in first_screen
    assert re.findall(r"\b[0-9a-f]{7,40}\b", first_screen) == []
    assert re.findall(r"\b[0-9a-f]{7,40}\b", "at commit 50d1588") == ["50d1588"]


def test_the_io_threads_bound_the_docs_state_is_the_codes() -> None:
    bound = _io_threads_max(GatewayConfig())
    design = (ROOT / "docs" / "design.md").read_text()
    reliability = (ROOT / "docs" / "reliability.md").read_text()
    assert f"are alive ({bound} with the defaults)" in design
    assert f"up to {bound} threads" in reliability
