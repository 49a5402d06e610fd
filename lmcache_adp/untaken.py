"""The stores LMCache handed the plugin that the tier did not take: each key of a store batch
reported False, whatever failed it (its deadline passed while it waited for room, the gateway
failed or refused it, or there was no gateway). LMCache then holds the chunk in L1 only, and
once L1 evicts it, it is gone from every tier: an operator must see how often that happens.

The counts go to the session's shared memory (``UNTAKEN``), where the gateway folds them into
its metrics and the session's summary line. While there is no session they are kept here, and
logged in one line once the gateway is back or the plugin closes. Thread-safe: the link's
thread counts what it reports, LMCache's submitting threads what they fail at once.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from adp_wire.units import format_size
from lmcache_adp.batch import Batch
from lmcache_adp.logs import log


class Untaken:
    def __init__(self) -> None:
        self._shared: np.ndarray[Any, np.dtype[np.uint64]] | None = None  # the session's
        self._offline = [0, 0]  # stores, bytes: while no session could hear of them
        self._lock = threading.Lock()

    def attach(self, shared: np.ndarray[Any, np.dtype[np.uint64]] | None) -> None:
        """Count into a new session's shared memory (None: there is no session now)."""
        if shared is not None:
            self.report_offline()
        with self._lock:
            self._shared = shared

    def count(self, batch: Batch) -> None:
        """A store batch is being reported: count its keys that were not stored."""
        missed = [i for i, stored in enumerate(batch.results) if not stored]
        buffers = batch.buffers
        if not missed:
            return
        if buffers is None or len(buffers) != len(batch.results):  # malformed: sizes unknown
            self._add(len(missed), 0)
        else:
            self._add(len(missed), sum(buffers[i].nbytes for i in missed))

    def _add(self, stores: int, nbytes: int) -> None:
        with self._lock:
            if self._shared is None:
                self._offline[0] += stores
                self._offline[1] += nbytes
            else:
                self._shared += np.array([stores, nbytes], np.uint64)

    def report_offline(self) -> None:
        with self._lock:
            (stores, nbytes), self._offline = self._offline, [0, 0]
        if stores:
            log.warning(
                "%d stores (%s) failed while no gateway could take them; LMCache keeps them in "
                "L1 only",
                stores,
                format_size(nbytes),
            )
