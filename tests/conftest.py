from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import Gateway, LMCacheServer, remove_tree, short_tmpdir


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = short_tmpdir()
    yield path
    remove_tree(path)


@pytest.fixture
def make_gateway(workdir: Path) -> Iterator[Callable[..., Gateway]]:
    made: list[Gateway] = []

    def make(*args: Any, **kwargs: Any) -> Gateway:
        gateway = Gateway(workdir, *args, **kwargs)
        made.append(gateway)
        return gateway

    yield make
    for gateway in made:
        gateway.kill()


@pytest.fixture
def gateway(make_gateway: Callable[..., Gateway]) -> Gateway:
    return make_gateway().start()


@pytest.fixture
def make_server(workdir: Path) -> Iterator[Callable[..., LMCacheServer]]:
    made: list[LMCacheServer] = []

    def make(l2_adapter_json: str, shm_name: str | None = None) -> LMCacheServer:
        server = LMCacheServer(workdir, l2_adapter_json, tag=f"-{len(made)}", shm_name=shm_name)
        made.append(server)
        return server

    yield make
    for server in made:
        server.kill()
