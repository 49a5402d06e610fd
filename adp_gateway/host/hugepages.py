"""Whether this host backs the sessions' shared memory with huge pages.

Both sides advise huge pages for a session's memory (adp_wire/ring/layout.py), so the gateway's
O_DIRECT requests to and from the window are not cut at every 4 KiB page boundary that physical
memory leaves; the kernel grants them only when its shmem setting allows. The gateway says once,
at start-up, which it is, and how to turn them on (docs/operations.md, "Huge pages").
"""

from __future__ import annotations

import re
from pathlib import Path

SHMEM_SETTING = Path("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
GRANTING = frozenset({"advise", "within_size", "always", "force"})  # honour MADV_HUGEPAGE


def shmem_setting(path: Path = SHMEM_SETTING) -> str | None:
    """The host's shmem huge-page setting (the bracketed word), or None where it has none."""
    try:
        text = path.read_text()
    except OSError:
        return None
    chosen = re.search(r"\[([a-z_]+)\]", text)
    return chosen.group(1) if chosen else None


def describe(setting: str | None) -> str:
    """One log line: whether session windows get huge pages, and if not, how to have them."""
    if setting in GRANTING:
        return f"session windows in huge pages (transparent_hugepage/shmem_enabled: {setting})"
    why = "no transparent huge pages" if setting is None else f"shmem_enabled is {setting!r}"
    return (
        f"session windows in 4 KiB pages ({why}): disk requests to and from them can be cut "
        f"to 512 KiB; `echo advise > {SHMEM_SETTING}` as root lets them reach the device's "
        "largest (docs/operations.md, 'Huge pages')"
    )
