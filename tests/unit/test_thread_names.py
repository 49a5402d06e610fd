"""Goal: the plugin's threads, inside LMCache's process, and the gateway's carry their names into
the OS, so ``top -H``, ``ps -L`` and ``perf`` tell them apart."""

from __future__ import annotations

import threading
from pathlib import Path

from adp_wire.threads import COMM_BYTES, NamedThread
from lmcache_adp import ADPConnector
from tests.support import Gateway


def os_names(pid: int | str = "self") -> set[str]:
    return {(task / "comm").read_text().strip() for task in Path(f"/proc/{pid}/task").iterdir()}


def test_a_named_thread_takes_its_name_in_the_os_cut_to_what_the_kernel_keeps() -> None:
    seen: list[str] = []

    def record() -> None:
        native = threading.get_native_id()
        seen.append(Path(f"/proc/self/task/{native}/comm").read_text().strip())

    thread = NamedThread(target=record, name="adp-a-name-longer-than-fifteen")
    thread.start()
    thread.join()
    assert seen == ["adp-a-name-longer-than-fifteen"[:COMM_BYTES]]


def test_the_plugins_threads_are_named_in_lmcaches_process(tmp_path: Path) -> None:
    connector = ADPConnector(socket_path=str(tmp_path / "no-gateway.sock"))
    try:
        assert {"adp-io", "adp-connect", "adp-copy-0"} <= os_names()
    finally:
        connector.close()


def test_the_gateways_threads_are_named_in_its_process(gateway: Gateway) -> None:
    assert gateway.proc is not None
    names = os_names(gateway.proc.pid)
    assert {"io-0", "expire", "accept"} <= names, names
