"""The plugin's lanes: what waits for the gateway, by kind, and what each kind may hold.

One LMCache server is one gateway session, and its lookups, prefetch loads and write-through
stores all arrive on it. So they wait in separate lanes, served in this order:

- LOOKUP (EXISTS) needs only a slot, and no lane but its own is ever ahead of it;
- LOAD needs a slot and window room, and goes before deletes and stores;
- DELETE needs only a slot;
- STORE needs a slot and window room (or none, zero-copy), and holds at most half of the
  session's slots and half of its window, so a store backlog never leaves loads without room.

LOAD, DELETE and STORE together leave an eighth of the slots free (``lookup_slots``), so a
lookup always finds one.

A request that cannot get room blocks only its own lane, never one served before it. A store
waits for room until its deadline however many wait with it: LMCache's L1 holds its bytes
already, and one failed at once would be in L1 only, gone from every tier once L1 evicts it.
What waits costs the plugin only its bookkeeping, bounded by ``pending_ops_max`` requests.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from enum import IntEnum
from typing import Any

import numpy as np

from adp_wire.protocol import (
    ARENA_BYTES_MIN,
    KEY_BYTES_MAX,
    KEYS_PER_REQUEST_MAX,
    Op,
    Welcome,
    encode_keys,
)
from lmcache_adp.batch import Batch
from lmcache_adp.config import ADPParams
from lmcache_adp.link import Request
from lmcache_adp.logs import log

# Keys of an EXISTS or DELETE travel in runs of at most this many msgpack bytes, which every
# gateway arena holds.
RUN_BYTES_MAX = ARENA_BYTES_MIN - 16
_KEY_OVERHEAD_BYTES = 5  # msgpack's str header


class Lane(IntEnum):
    """In the order the lanes are served."""

    LOOKUP = 0
    LOAD = 1
    DELETE = 2
    STORE = 3


LANE_OF = {Op.EXISTS: Lane.LOOKUP, Op.GET: Lane.LOAD, Op.DELETE: Lane.DELETE, Op.SET: Lane.STORE}


def room(lane: Lane, welcome: Welcome) -> tuple[int, int, int]:
    """The slots and window bytes the requests of ``lane`` may hold at once on a session, and
    the free slots they must leave: every lane but LOOKUP leaves an eighth of the slots (at
    least one) to lookups, whatever the other lanes hold, so a lookup the presence table
    cannot answer never waits for a load or a store to end."""
    slots, window = welcome.slots, welcome.window_bytes
    kept = lookup_slots(slots)
    if lane == Lane.STORE:
        return max(1, slots // 2), window // 2, kept
    if lane == Lane.LOAD:
        return max(1, slots - kept), window, kept
    if lane == Lane.DELETE:
        return slots, 0, kept
    return slots, 0, 0


def lookup_slots(slots: int) -> int:
    """The slots kept free for lookups on a session of ``slots``: an eighth, at least one
    (none on a one-slot session, which could then do nothing else)."""
    return max(1, slots // 8) if slots > 1 else 0


class Lanes:
    def __init__(self, params: ADPParams) -> None:
        self._params = params
        # Per lane, the requests of each admitted batch, made only as they come to the front:
        # admitting a batch of 32 stores costs one pass over its keys, not 32 requests at once.
        self._queues: dict[Lane, deque[Iterator[Request]]] = {lane: deque() for lane in Lane}
        self._heads: dict[Lane, Request | None] = dict.fromkeys(Lane)
        self._waiting = 0

    def admit(self, batch: Batch) -> bool:
        """Queue the batch's requests; False (nothing queued) when it must fail at once."""
        if batch.buffers is None:  # EXISTS, DELETE: runs of keys
            runs = list(key_runs(batch))
            count, requests = len(runs), iter(runs)
        else:  # GET, SET: one request per object, made when it reaches the front
            carried = _carried(batch.keys)
            count, requests = len(carried), _objects(batch, carried)
        if self._waiting + count > self._params.pending_ops_max:
            log.warning(
                "%d ops are waiting for the gateway; failing a new %s of %d keys",
                self._waiting,
                batch.op.name,
                len(batch.keys),
            )
            return False
        batch.remaining = count
        self._queues[LANE_OF[batch.op]].append(requests)
        self._waiting += count
        return True

    def head(self, lane: Lane) -> Request | None:
        request, queue = self._heads[lane], self._queues[lane]
        while request is None and queue:
            request = next(queue[0], None)
            if request is None:
                queue.popleft()  # that batch's requests are all out
        self._heads[lane] = request
        return request

    def pop(self, lane: Lane) -> Request:
        request = self.head(lane)
        assert request is not None
        self._heads[lane] = None
        self._waiting -= 1
        return request

    def drain(self) -> Iterator[Request]:
        """Take every waiting request, in lane order."""
        for lane in Lane:
            while self.head(lane) is not None:
                yield self.pop(lane)


def key_runs(batch: Batch) -> Iterator[Request]:
    """Ring requests for an EXISTS or DELETE: runs of keys that fit an arena.

    A key longer than the protocol allows is left out: it stays a miss (False).
    """
    # A lookup of 1,000 keys is on LMCache's critical path: no Python loop per key here.
    keys = batch.keys
    encoded = keys if all(map(str.isascii, keys)) else map(str.encode, keys)
    sizes = np.fromiter(map(len, encoded), np.int64, len(keys))
    start = 0
    for stop in [*np.flatnonzero(sizes > KEY_BYTES_MAX).tolist(), len(keys)]:
        yield from _runs(batch, sizes, start, stop)
        start = stop + 1


def _runs(batch: Batch, sizes: np.ndarray[Any, Any], start: int, stop: int) -> Iterator[Request]:
    """Requests for keys ``start:stop`` (each short enough): as many keys in each as fit."""
    ends = np.cumsum(sizes[start:stop] + _KEY_OVERHEAD_BYTES)  # ends[i]: bytes of keys 0..i
    sent = 0  # bytes of the keys already in requests
    first = start
    while first < stop:
        last = start + int(np.searchsorted(ends, sent + RUN_BYTES_MAX, side="right"))
        last = min(last, first + KEYS_PER_REQUEST_MAX)
        run = batch.keys[first:last]
        yield Request(batch.op, run, first, batch, payload=encode_keys(run))
        sent = int(ends[last - start - 1])
        first = last


def _carried(keys: list[str]) -> list[int]:
    """The indexes of the keys the protocol can carry (the others stay misses)."""
    return [i for i, key in enumerate(keys) if len(key.encode()) <= KEY_BYTES_MAX]


def _objects(batch: Batch, carried: list[int]) -> Iterator[Request]:
    """One request per object of a GET or SET batch, the keys at ``carried``, made on demand."""
    assert batch.buffers is not None
    for i in carried:
        key = batch.keys[i]
        yield Request(batch.op, [key], i, batch, batch.buffers[i].nbytes, encode_keys([key]))
