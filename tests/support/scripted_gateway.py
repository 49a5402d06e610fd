"""A peer that speaks the gateway's side of adp_wire and does what a test scripts: for tests of
how the plugin meets a gateway that breaks the protocol or hangs up at a given moment, which
the real gateway cannot be made to do. Everything else the plugin is tested against the real
gateway process (tests/support/__init__.py: Gateway)."""

from __future__ import annotations

import contextlib
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from adp_wire.protocol import Welcome, recv_frame, send_frame, welcome_body
from adp_wire.ring import doorbell
from adp_wire.ring.layout import Completion, RingLayout, Submission, create_shared
from adp_wire.ring.queue import Consumer, Producer, completion_producer, submission_consumer

HANDSHAKE_S = 5.0


@dataclass
class PeerSession:
    conn: socket.socket
    submit_doorbell: int
    complete_doorbell: int
    submissions: Consumer[Submission]
    completions: Producer[Completion]
    _keep: list[object] = field(default_factory=list)  # the mapping and its fd, kept open

    def next_submissions(self, timeout_s: float) -> list[Submission]:
        """The submissions posted by the time the plugin rings, within ``timeout_s``."""
        poller = select.poll()
        poller.register(self.submit_doorbell, select.POLLIN)
        if poller.poll(timeout_s * 1000):
            doorbell.answer(self.submit_doorbell)
        return list(self.submissions.pop_all())

    def complete(self, completions: list[Completion], ring: bool = True) -> None:
        """Post ``completions``; ``ring``: and tell the plugin (else ``ring`` later)."""
        for completion in completions:
            assert self.completions.push(completion)
        if ring:
            self.ring()

    def ring(self) -> None:
        doorbell.ring(self.complete_doorbell)


def done(submission: Submission) -> Completion:
    """OK for ``submission`` (a SET's or DELETE's; no per-key results)."""
    return Completion(submission.op_id, submission.slot, 0, 0, 0, 0, 0, submission.data_bytes)


class ScriptedGateway:
    """Listens on ``path``; each client that says hello gets a session (16 slots, no L1, no
    remote copy unless ``remote_copy``), then ``script(session)`` runs on a thread of its own."""

    def __init__(
        self, path: Path, script: Callable[[PeerSession], None], remote_copy: bool = False
    ) -> None:
        self.path = path
        self.sessions: list[PeerSession] = []
        self._script = script
        self._remote_copy = remote_copy
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        self._listener.listen(8)
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            _, fds = recv_frame(conn, fds_max=4, deadline=time.monotonic() + HANDSHAKE_S)
            for fd in fds:
                os.close(fd)
            layout = RingLayout(16, 65536, 1 << 24)
            memfd, mapping = create_shared(layout)
            submit, complete = doorbell.new(), doorbell.new()
            welcome = Welcome(
                len(self.sessions) + 1, 16, 65536, 1 << 24, 1 << 24,
                remote_copy=int(self._remote_copy),
            )  # fmt: skip
            send_frame(conn, welcome_body(welcome), [memfd, submit, complete], time.monotonic() + 5)
            view = memoryview(mapping)
            session = PeerSession(
                conn,
                submit,
                complete,
                submission_consumer(view, layout),
                completion_producer(view, layout),
                [mapping, memfd],
            )
            self.sessions.append(session)
            threading.Thread(target=self._script, args=(session,), daemon=True).start()

    def close(self) -> None:
        self._listener.close()
        for session in self.sessions:
            with contextlib.suppress(OSError):
                session.conn.close()
