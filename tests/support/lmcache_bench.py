"""``lmcache bench l2``, LMCache's own harness, through our plugin: one run's figures per
operation (``store``, ``load``, ``lookup``...), the run failing the test when the harness does."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.support import BIN, Gateway


def bench_l2_figures(
    gateway: Gateway, out: Path, *args: str, timeout_s: float = 600
) -> dict[str, dict[str, Any]]:
    """Runs the harness on ``gateway`` with ``args``, its JSON report in ``out``."""
    argv = [str(BIN / "lmcache"), "bench", "l2", "--l2-adapter", gateway.l2_adapter_json()]
    argv += ["--format", "json", "--output", str(out), *args]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    metrics: dict[str, dict[str, Any]] = json.loads(out.read_text())["metrics"]
    return {m["operation"]: m for k, m in metrics.items() if k.startswith("op_")}
