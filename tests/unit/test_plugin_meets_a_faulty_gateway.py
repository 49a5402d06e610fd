"""Goal: whatever a gateway does wrong, or at an awkward moment, the plugin reports each op once
and keeps LMCache's process whole. Ops the gateway completed just before it hung up are done,
not failed; a completion of no op in flight costs the link, not the valid completions beside
it; bytes on the socket after the welcome drop the link (and the plugin connects again) rather
than waking its I/O thread for ever; close() reports a store in flight even when the
socket's fd number is past what select() takes; and a close() called while another runs returns
only once that one has reported everything."""

from __future__ import annotations

import os
import resource
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lmcache_adp import ADPConnector
from tests.support import wait_for_future, wait_until
from tests.support.scripted_gateway import PeerSession, ScriptedGateway, done

STORE = [memoryview(bytearray(8192)), memoryview(bytearray(8192))]


@pytest.fixture
def peer(tmp_path: Path) -> Iterator[Callable[..., ScriptedGateway]]:
    made: list[ScriptedGateway] = []

    def make(script: Callable[[PeerSession], None], remote_copy: bool = False) -> ScriptedGateway:
        made.append(ScriptedGateway(tmp_path / "gw.sock", script, remote_copy))
        return made[-1]

    yield make
    for gateway in made:
        gateway.close()


def connector(gateway: ScriptedGateway, **params: object) -> ADPConnector:
    plugin = ADPConnector(**{"socket_path": str(gateway.path), "op_timeout_s": 3.0, **params})
    wait_until(lambda: bool(gateway.sessions), 10, "the plugin to say hello")
    return plugin


def stored_through(gateway: ScriptedGateway) -> object:
    """Whether a store of two keys through ``gateway`` was reported done."""
    plugin = connector(gateway, remote_copy=False)
    try:
        return wait_for_future(plugin, plugin.submit_batch_set(["k1", "k2"], STORE), 10)[1]
    finally:
        plugin.close()


def a_store_never_completed(peer: Callable[..., ScriptedGateway]) -> tuple[ADPConnector, int]:
    """A plugin (op timeout 1 s) with a store posted, read from L1 by a gateway that never
    completes it; and the store's future."""
    posted: list[object] = []

    def script(session: PeerSession) -> None:
        for _ in range(100):
            posted.extend(session.next_submissions(0.1))

    plugin = connector(peer(script, remote_copy=True), op_timeout_s=1.0)
    future = plugin.submit_batch_set(["k"], STORE[:1])
    wait_until(lambda: bool(posted), 10, "the store to be posted")
    return plugin, future


def test_ops_completed_just_before_the_gateway_hung_up_are_done(
    peer: Callable[..., ScriptedGateway],
) -> None:
    def script(session: PeerSession) -> None:
        submissions = session.next_submissions(10)
        session.complete([done(s) for s in submissions], ring=False)
        session.conn.close()  # a stop, right after the work was done
        session.ring()

    assert stored_through(peer(script)) is True


def test_a_completion_of_no_op_in_flight_costs_the_link_not_the_valid_ones(
    peer: Callable[..., ScriptedGateway],
) -> None:
    def script(session: PeerSession) -> None:
        submissions = session.next_submissions(10)
        if not submissions:  # the session the plugin opens again after the link is dropped
            return
        stray = done(submissions[0])._replace(op_id=999_999)
        session.complete([*map(done, submissions), stray])

    assert stored_through(peer(script)) is True


def test_bytes_after_the_welcome_drop_the_link_and_the_plugin_connects_again(
    peer: Callable[..., ScriptedGateway],
) -> None:
    def script(session: PeerSession) -> None:
        if len(gateway.sessions) == 1:
            session.conn.send(b"x")

    gateway = peer(script)
    plugin = connector(gateway, remote_copy=False)
    try:
        wait_until(lambda: len(gateway.sessions) >= 2, 10, "the plugin to drop the link")
    finally:
        plugin.close()


def test_close_reports_a_store_in_flight_when_the_sockets_fd_is_past_select(
    peer: Callable[..., ScriptedGateway],
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"the fd limit ({hard}) leaves no room past 1024")
    resource.setrlimit(resource.RLIMIT_NOFILE, (2048, hard))
    held = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]
    try:
        plugin, future = a_store_never_completed(peer)
        plugin.close()
        assert [item[:2] for item in plugin.drain_completions()] == [(future, False)]
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_second_close_returns_once_the_first_has_reported_everything(
    peer: Callable[..., ScriptedGateway],
) -> None:
    """The first close waits up to one op timeout for a gateway that never lets go of L1; one
    that returned at once would let LMCache unmap L1 under a plugin still closing, and each
    would close the plugin's wake fd (the second time, whichever fd took its number)."""
    plugin, future = a_store_never_completed(peer)
    first = threading.Thread(target=plugin.close)
    first.start()
    try:
        time.sleep(0.2)
        plugin.close()
        assert [item[:2] for item in plugin.drain_completions()] == [(future, False)]
        assert not [t for t in threading.enumerate() if t.name.startswith("adp-")]
    finally:
        first.join(10)
