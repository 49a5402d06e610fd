"""Handshake slots: how many handshakes may be in progress at once, per peer uid.

A handshake holds a thread and a slot from ``accept`` until its welcome is sent or it is
refused, at most ``handshake_timeout_s`` (a deadline for the whole handshake). The slots are
kept per peer uid (the kernel's SO_PEERCRED, known before a byte is read): each uid may hold
``PER_UID_MAX`` at once, so a stranger dripping bytes into eight connections holds only its
own eight, never those of the users the config declares. The uids the gateway knows (root, its
own, every uid a tenant lists, and every peer whose gid a tenant lists) each keep their own
slots whatever the others do; all other peers share ``STRANGERS_MAX`` slots among them, which
bounds the threads any number of them can hold.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Callable

from adp_gateway.front.tenants import Peer

PER_UID_MAX = 8
STRANGERS_MAX = 32


class HandshakeSlots:
    def __init__(self, declared: Callable[[Peer], bool]) -> None:
        """``declared``: whether the config names this peer (tenants.py)."""
        self._declared = declared
        self._lock = threading.Lock()
        self._held: Counter[int] = Counter()  # uid -> handshakes in progress
        self._strangers = 0

    def take(self, peer: Peer) -> str | None:
        """Take a slot for ``peer``'s handshake; None when taken, else why not (the refusal
        the peer is told)."""
        known = peer.uid in (0, os.geteuid()) or self._declared(peer)
        with self._lock:
            if self._held[peer.uid] >= PER_UID_MAX:
                return (
                    f"{PER_UID_MAX} handshakes of uid {peer.uid} are in progress already; "
                    "try again shortly"
                )
            if not known and self._strangers >= STRANGERS_MAX:
                return (
                    f"{STRANGERS_MAX} handshakes of users the gateway config does not declare "
                    "are in progress already; try again shortly"
                )
            self._held[peer.uid] += 1
            self._strangers += not known
        return None

    def give_back(self, peer: Peer) -> None:
        known = peer.uid in (0, os.geteuid()) or self._declared(peer)
        with self._lock:
            self._held[peer.uid] -= 1
            if not self._held[peer.uid]:
                del self._held[peer.uid]
            self._strangers -= not known
