"""Goal: admission through a real gateway and a real plugin. Under the default budget a light
load is written whole (what a restart restores); past a tight budget, stores are declined yet
reported to LMCache as done, are not found, and are counted alike by ``adp-gateway status`` and
the metrics; ``admission: false`` writes everything whatever the budget."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lmcache_adp import ADPConnector
from tests.support import BIN, Gateway, free_port, wait_for_future
from tests.support.plugin import connected, keyed_objects

pytestmark = pytest.mark.integration
SIZE = 64 * 2**10


def store_all(gateway: Gateway, objects: dict[str, bytes]) -> tuple[list[bool], list[bool]]:
    """Store every object, one batch each; whether each store was reported done, and then
    whether each key is found."""
    connector = ADPConnector(**gateway.adapter_params())
    try:
        connected(connector)
        done = []
        for key, data in objects.items():
            future = connector.submit_batch_set([key], [memoryview(bytearray(data))])
            done.append(bool(wait_for_future(connector, future)[1]))
        found = wait_for_future(connector, connector.submit_batch_exists(list(objects)))[3]
        return done, list(found)
    finally:
        connector.close()


def status(gateway: Gateway) -> dict[str, Any]:
    argv = [str(BIN / "adp-gateway"), "status", "--socket", str(gateway.socket_path), "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def configured(make_gateway: Callable[..., Gateway], workdir: Path, text: str) -> Gateway:
    (workdir / "policy.yaml").write_text(text)
    return make_gateway("256MiB", "--config", str(workdir / "policy.yaml")).start()


def test_under_the_default_budget_a_light_load_is_written_whole(gateway: Gateway) -> None:
    done, found = store_all(gateway, keyed_objects(1, 40, SIZE))
    assert all(done) and all(found)
    admission = status(gateway)["admission"]
    assert admission["admitted"] == 40 and admission["declined"] == 0
    assert admission["write_budget_bytes_per_s"] > 0  # 1dwpd of the capacity


def test_past_a_tight_budget_stores_are_declined_reported_done_and_counted(
    make_gateway: Callable[..., Gateway], workdir: Path
) -> None:
    port = free_port()
    gateway = configured(
        make_gateway,
        workdir,
        f"write_budget: 4KiB/s\nwrite_budget_burst_s: 1\nmetrics_address: 127.0.0.1:{port}\n",
    )
    done, found = store_all(gateway, keyed_objects(2, 40, SIZE))
    assert all(done), "a declined store is done for LMCache"
    assert 1 <= sum(found) <= 5, found  # the full bucket paid for the first
    lines = subprocess.run(
        [str(BIN / "adp-gateway"), "status", "--socket", str(gateway.socket_path)],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "of a budget of 4 KiB/s" in lines and "declined" in lines
    admission = status(gateway)["admission"]
    assert admission["declined"] == 40 - sum(found) and admission["declined_for_budget"] >= 1
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    declined = f'adp_gateway_admission_stores_total{{decision="declined"}} {admission["declined"]}'
    assert declined + ".0" in text and "adp_gateway_write_budget_bytes_per_second 4096.0" in text


def test_admission_off_writes_everything_whatever_the_budget(
    make_gateway: Callable[..., Gateway], workdir: Path
) -> None:
    gateway = configured(
        make_gateway, workdir, "admission: false\nwrite_budget: 4KiB/s\nwrite_budget_burst_s: 1\n"
    )
    done, found = store_all(gateway, keyed_objects(3, 40, SIZE))
    assert all(done) and all(found)
    assert (
        "admission off"
        in subprocess.run(
            [str(BIN / "adp-gateway"), "status", "--socket", str(gateway.socket_path)],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    )
