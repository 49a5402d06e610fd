"""What the region log offers the background preparer (devices/preparer.py): which free regions
still hold never-written blocks, and a hold on one while the preparer writes it once.

A region held here is not free: the log takes another meanwhile, and the preparer gives it back
at its next progress report once the log may need it (fewer than two others free).
"""

from __future__ import annotations

from adp_gateway.card.software.devices.preparer import base_device
from adp_gateway.card.software.regions import LogState


class Preparation:
    """Implements devices/preparer.py's ``Work`` over the log's state."""

    def __init__(self, state: LogState) -> None:
        self._state = state

    def unprepared_regions(self) -> int:
        with self._state.lock:
            return sum(
                1
                for db in self._state.databases
                for r in db.regions
                if r.epoch == 0 and r.prepared_bytes < db.region_bytes
            )

    def claim_unprepared(self, idle_s: float) -> tuple[int, int, int, int] | None:
        with self._state.lock:
            for db in self._state.databases:
                if not db.idle(idle_s):
                    continue
                free = [r for r in db.regions if r.epoch == 0 and not r.preparing]
                todo = [r for r in free if r.prepared_bytes < db.region_bytes]
                # Leave two free regions to the log, so it never waits for one held here.
                if not todo or len(free) < 3:
                    continue
                region = todo[0]
                region.preparing = True
                db.takes_seen = db.takes
                start = db.region_offset(region.index)
                end = start + db.region_bytes
                return db.index, region.index, start + region.prepared_bytes, end
        return None

    def write_zeros(self, database: int, zeros: memoryview, offset: int) -> None:
        base_device(self._state.databases[database].device).write([zeros], offset)

    def prepared(self, database: int, region: int, upto: int, idle_s: float) -> bool:
        db = self._state.databases[database]
        with self._state.lock:
            held = db.regions[region]
            held.prepared_bytes = upto - db.region_offset(region)
            room = True
            if db.takes != db.takes_seen:  # regions were taken since: count the free ones
                db.takes_seen = db.takes
                room = sum(1 for r in db.regions if r.epoch == 0 and not r.preparing) >= 2
            if held.prepared_bytes < db.region_bytes and room and db.idle(idle_s):
                return True
            held.preparing = False
            db.free_order = None  # it may now go before regions still unwritten
            return False

    def give_back(self, database: int, region: int, upto: int) -> None:
        db = self._state.databases[database]
        with self._state.lock:
            held = db.regions[region]
            held.prepared_bytes = upto - db.region_offset(region)
            held.preparing = False
            db.free_order = None
