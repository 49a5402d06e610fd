"""What the connector's threads share: LMCache's submitting threads, the link's thread (the
I/O loop), the copy threads and the connect thread.

Submits put batches in a bounded ``Inbox`` and wake the link's thread through an eventfd; copy
threads hand their results back through ``Shared.call``; the connect thread hands over new
links. Only the link's thread touches the link itself (lmcache_adp/ioloop.py).
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from adp_wire.ring import doorbell
from lmcache_adp import config
from lmcache_adp.batch import Batch
from lmcache_adp.completions import CompletionQueue
from lmcache_adp.link import GatewayLink
from lmcache_adp.lookups import LocalLookups
from lmcache_adp.untaken import Untaken

INBOX_BATCHES_MAX = 4096  # submitted batches the link's thread has not taken yet


class Inbox:
    """Batches from LMCache's submitting threads to the link's thread, which each put wakes
    (``wake``, its doorbell); bounded, never blocks."""

    def __init__(self, wake: int, capacity: int = INBOX_BATCHES_MAX) -> None:
        self._wake = wake
        self._items: deque[Batch] = deque()
        self._capacity = capacity
        self._lock = threading.Lock()
        self._closed = False

    def put(self, batch: Batch) -> bool:
        """Queue ``batch`` and ring; False, and nothing queued, when the inbox is full or
        closed. The ring happens under the lock, so once ``close`` returns no put rings any
        more and the doorbell may be closed."""
        with self._lock:
            if self._closed or len(self._items) >= self._capacity:
                return False
            self._items.append(batch)
            doorbell.ring(self._wake)
            return True

    def take(self) -> Batch | None:
        with self._lock:
            return self._items.popleft() if self._items else None

    def close(self) -> list[Batch]:
        """Refuse every later batch; return those still queued. A submit that raced the
        plugin's close is thus either refused at once or handed back here, never left behind."""
        with self._lock:
            self._closed = True
            items, self._items = list(self._items), deque()
        return items


@dataclass
class Shared:
    """What the connector's threads share. Deques and events are thread-safe as used here."""

    params: config.ADPParams
    completions: CompletionQueue = field(default_factory=CompletionQueue)
    wake: int = field(default_factory=doorbell.new)  # the link's thread's doorbell
    inbox: Inbox = field(init=False)  # submits -> the link's thread
    calls: deque[Callable[[], None]] = field(default_factory=deque)  # copiers -> the link's thread
    new_links: deque[GatewayLink] = field(default_factory=deque)  # connect -> the link's thread
    stopping: threading.Event = field(default_factory=threading.Event)
    want_link: threading.Event = field(default_factory=threading.Event)  # I/O -> connect
    op_ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    lookups: LocalLookups | None = None  # the current link's; the link's thread sets it
    untaken: Untaken = field(default_factory=Untaken)  # stores not taken, counted for the gateway

    def __post_init__(self) -> None:
        self.inbox = Inbox(self.wake)

    def wake_io(self) -> None:
        doorbell.ring(self.wake)

    def call(self, function: Callable[[], None]) -> None:
        """Run ``function`` on the link's thread at its next step (from any thread)."""
        self.calls.append(function)
        self.wake_io()
