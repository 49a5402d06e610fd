"""The gateway's front door: accepts connections on its Unix socket and handshakes each one.

A connection is either a status request (``adp-gateway status``, answered for root and the
gateway's own user, then closed) or a client's hello: its tenant is admitted (tenants.py), its
L1 segment mapped for zero-copy ops when it sent one (or its process attached for remote copy
when it offered that and the kernel lets the gateway read it: remote.py), and a session is
opened and welcomed. The whole handshake, however the client paces its bytes, completes within
``handshake_timeout_s`` or is dropped, and handshakes in progress are bounded per peer uid
(handshake_slots.py). A connection refused for any reason gets one frame saying why, never
waiting on the client, and leaves a line in the log (refusals.py: folded per peer uid and reason
under a flood).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from adp_gateway.config import GatewayConfig
from adp_gateway.errors import GatewayError, ProtocolError
from adp_gateway.front import unix_socket
from adp_gateway.front.handshake_slots import HandshakeSlots
from adp_gateway.front.refusals import RefusalLog
from adp_gateway.front.tenants import AccessDenied, Peer, Tenants
from adp_gateway.sessions.client_l1 import L1Segment
from adp_gateway.sessions.client_process import ClientProcess
from adp_gateway.sessions.session import Session
from adp_wire.protocol import (
    Hello,
    is_status_request,
    parse_hello,
    recv_frame,
    send_frame,
    welcome_body,
)
from adp_wire.threads import NamedThread

log = logging.getLogger(__name__)
ACCEPT_RETRY_S = 0.1  # after accept() failed for want of fds or memory
ACCEPT_WARN_EVERY_S = 10.0

# Makes the session of an admitted client, or raises HandshakeRefused (the gateway is full).
OpenSession = Callable[[socket.socket, Hello, str, L1Segment | None, ClientProcess | None], Session]


class Reception:
    def __init__(
        self,
        config: GatewayConfig,
        tenants: Tenants,
        open_session: OpenSession,
        status: Callable[[], dict[str, Any]],
    ) -> None:
        self._config = config
        self._tenants = tenants
        self._open_session = open_session
        self._status = status
        self._slots = HandshakeSlots(tenants.declares)
        self.refusals = RefusalLog(log)

    def run(self, listener: socket.socket) -> None:
        """Accept until the listener is shut down; each connection is served on a thread of
        its own, which runs its session once the handshake is done."""
        quiet_until = 0.0  # no warning of a failed accept before then
        while True:
            try:
                conn, _ = listener.accept()
            except OSError as exc:
                if exc.errno in (errno.EINVAL, errno.EBADF):
                    return  # the listener is shut down: the gateway is stopping
                # Out of fds or memory for a moment (EMFILE, ENFILE, ENOBUFS): the clients
                # wait in the backlog, and accepting goes on once there is room.
                if time.monotonic() >= quiet_until:
                    log.warning("accepting a client failed (%s); trying again", exc)
                    quiet_until = time.monotonic() + ACCEPT_WARN_EVERY_S
                time.sleep(ACCEPT_RETRY_S)
                continue
            peer = unix_socket.peer_of(conn)
            busy = self._slots.take(peer)
            if busy is not None:
                self._refuse(conn, peer, busy, "busy")
                continue
            try:
                NamedThread(
                    target=self._serve, args=(conn, peer), name="session", daemon=True
                ).start()
            except RuntimeError as exc:  # no thread to be had
                self._slots.give_back(peer)
                self._refuse(conn, peer, f"the gateway cannot serve it now ({exc})", "busy")

    def _serve(self, conn: socket.socket, peer: Peer) -> None:
        """Handshake (holding a handshake slot), then run the session (holding none)."""
        try:
            session = self._handshake(conn, peer)
        finally:
            self._slots.give_back(peer)
        if session is not None:
            session.run()

    def _handshake(self, conn: socket.socket, peer: Peer) -> Session | None:
        received: list[int] = []  # the client's L1 segment, if it sent one
        deadline = time.monotonic() + self._config.handshake_timeout_s  # for all of it
        try:
            body, received = recv_frame(conn, fds_max=1, deadline=deadline)
            if is_status_request(body):
                self._answer_status(conn, peer, deadline)
                return None
            hello = parse_hello(body)
            self._tenants.admit(hello, peer)
            l1 = _map_l1(hello, received, peer)
            remote = None
            if l1 is None:
                remote = ClientProcess.attach(peer.pid, hello.remote_probe, hello.remote_token)
            try:
                session = self._open_session(conn, hello, str(peer), l1, remote)
            except BaseException:
                if remote is not None:
                    remote.close()
                if l1 is not None:
                    l1.close()
                raise
            try:
                welcome, fds = session.welcome()
                send_frame(conn, welcome_body(welcome), fds, deadline)
                conn.settimeout(None)
            except BaseException:  # the client went away mid-handshake: free what it held
                session.close(started=False)
                raise
        except TimeoutError:
            self._refuse(conn, peer, self._timed_out(), "timeout")
            return None
        except (GatewayError, OSError) as exc:
            kind = exc.kind if isinstance(exc, AccessDenied) else type(exc).__name__
            self._refuse(conn, peer, str(exc) or type(exc).__name__, kind)
            return None
        finally:
            for fd in received:
                os.close(fd)
        path = (
            " (zero-copy to its L1)" if l1 else " (remote copy from its memory)" if remote else ""
        )
        log.info("%s connected%s", session.name, path)
        return session

    def _timed_out(self) -> str:
        return (
            f"the handshake did not complete within handshake_timeout_s "
            f"({self._config.handshake_timeout_s:g} s); dropped"
        )

    def _answer_status(self, conn: socket.socket, peer: Peer, deadline: float) -> None:
        """``adp-gateway status``: for the gateway's own user and root only, since it names
        every tenant and what each holds."""
        if peer.uid not in (0, os.geteuid()):
            raise AccessDenied(
                f"status is for root and the gateway's user (uid {os.geteuid()}), not uid "
                f"{peer.uid}",
                "status",
            )
        send_frame(conn, {"ok": True, "status": self._status()}, deadline=deadline)
        conn.close()

    def _refuse(self, conn: socket.socket, peer: Peer, why: str, kind: str) -> None:
        """Tell the client why in one frame (never waiting on it), close, log (refusals.py:
        one line per refusal, folded per uid and ``kind`` under a flood)."""
        self.refusals.refused(peer, kind, why)
        with contextlib.suppress(OSError):
            conn.setblocking(False)
            send_frame(conn, {"ok": False, "error": why})
        conn.close()


def _map_l1(hello: Hello, fds: list[int], peer: Peer) -> L1Segment | None:
    """The client's L1 segment for zero-copy ops; None (the copy path) when it sent none or
    one that does not map, which is logged."""
    if not hello.l1_bytes or len(fds) != 1:
        return None
    try:
        return L1Segment(fds[0], hello.l1_bytes)
    except ProtocolError as exc:
        log.warning("client %s: %s; its ops use the copy path", peer, exc)
        return None
