"""Goal: the presence table (adp_wire/presence.py, adp_gateway/sessions/presence.py) answers, as the
plugin reads it through its read-only fd, exactly what the tenant holds: keys added and removed in
any order, runs that wrap around the table's end, keys removed from the middle of a run; when a key
finds no cell the table says so (not complete) until that key is gone; the plugin cannot write it;
and a table that is not what the welcome promised is refused."""

from __future__ import annotations

import mmap
import os
import random
from collections.abc import Iterator

import pytest

from adp_gateway.sessions.presence import LOAD_MAX, Presence, PresenceTable, slots_for
from adp_wire.errors import ProtocolError
from adp_wire.presence import PROBES_MAX, SLOTS_MAX, SLOTS_MIN, PresenceView, table_bytes
from adp_wire.sealed import sealed_memfd
from tests.support.presence import keys_at_home


@pytest.fixture
def table() -> Iterator[PresenceTable]:
    made = PresenceTable(SLOTS_MIN)
    yield made
    made.close()


def view_of(table: PresenceTable) -> PresenceView:
    fd = table.read_only_fd()
    try:
        return PresenceView(fd, table.slots)
    finally:
        os.close(fd)


def test_it_answers_what_the_tenant_holds_through_any_adds_and_removes(
    table: PresenceTable,
) -> None:
    view = view_of(table)
    rng = random.Random(7)
    universe = [f"key-{i}" for i in range(600)]
    held: set[str] = set()
    for step in range(4000):
        key = rng.choice(universe)
        if key in held:
            table.remove(key)
            held.discard(key)
        else:
            table.add(key)
            held.add(key)
        if step % 200 == 0:
            assert view.find(universe) == [k in held for k in universe]
    assert view.find(universe) == [k in held for k in universe]
    assert view.complete


def test_a_key_removed_from_the_middle_of_a_wrapping_run_leaves_the_rest_findable(
    table: PresenceTable,
) -> None:
    """A run that starts at the last cell wraps to the first; removing any key of it shifts
    the later ones back, and none is lost."""
    run = keys_at_home(6, table.slots, table.slots - 1)
    view = view_of(table)
    for key in run:
        table.add(key)
    assert view.find(run) == [True] * 6
    for gone in (run[1], run[4], run[0]):
        table.remove(gone)
        run.remove(gone)
        assert view.find([*run, gone]) == [True] * len(run) + [False]


def test_a_key_without_a_cell_makes_the_table_incomplete_until_it_is_gone(
    table: PresenceTable,
) -> None:
    """More keys at one home than a reader probes: the extra ones are left out, and the reader
    then says it cannot answer for a key it does not find (the plugin asks the gateway)."""
    run = keys_at_home(PROBES_MAX + 2, table.slots, 5)
    view = view_of(table)
    for key in run:
        table.add(key)
    assert not view.complete
    assert view.find(run[:PROBES_MAX]) == [True] * PROBES_MAX  # found ones are still answered
    assert view.find(run) is None and view.find(["absent"]) is None
    table.remove(run[-1])
    assert view.find(["absent"]) is None  # one key is still left out
    table.remove(run[-2])
    assert view.complete and view.find(["absent", run[0]]) == [False, True]


def test_the_table_stops_taking_keys_before_it_is_full(table: PresenceTable) -> None:
    """Every run must end in an empty cell (a removal walks to it), so the table takes keys
    only up to LOAD_MAX of its cells; the rest are left out."""
    keys = [f"k{i}" for i in range(table.slots)]
    for key in keys:
        table.add(key)
    view = view_of(table)
    assert not view.complete
    held = sum(view.find([key]) == [True] for key in keys)
    assert table.slots // 2 < held <= int(table.slots * LOAD_MAX)
    for key in keys:
        table.remove(key)
    assert view.complete and view.find(keys) == [False] * len(keys)


def test_the_plugin_cannot_write_the_table(table: PresenceTable) -> None:
    fd = table.read_only_fd()
    try:
        with pytest.raises(PermissionError):
            mmap.mmap(fd, os.fstat(fd).st_size)  # shared and writable
        with pytest.raises(OSError):
            os.write(fd, b"x")
    finally:
        os.close(fd)


def test_a_table_that_is_not_what_the_welcome_promised_is_refused(table: PresenceTable) -> None:
    fd = table.read_only_fd()
    try:
        with pytest.raises(ProtocolError, match="bytes, not"):
            PresenceView(fd, table.slots * 2)
        with pytest.raises(ProtocolError, match="power of two"):
            PresenceView(fd, table.slots + 1)
    finally:
        os.close(fd)
    stranger = sealed_memfd("not-a-table", 64 + 8 * SLOTS_MIN)
    try:
        with pytest.raises(ProtocolError, match="header"):
            PresenceView(stranger, SLOTS_MIN)
    finally:
        os.close(stranger)


def test_a_table_its_maker_could_shrink_is_refused_before_it_is_mapped() -> None:
    """Shrunk under the plugin's mapping, the next lookup would be a SIGBUS in LMCache."""
    unsealed = os.memfd_create("adp-presence")
    try:
        os.ftruncate(unsealed, table_bytes(SLOTS_MIN))
        with pytest.raises(ProtocolError, match="not sealed at its size"):
            PresenceView(unsealed, SLOTS_MIN)
    finally:
        os.close(unsealed)


def test_each_tenant_has_its_own_table() -> None:
    presence = Presence()
    try:
        presence.added("a", "k")
        views = {}
        for tenant in ("a", "b"):
            fd, slots = presence.share(tenant)
            views[tenant] = PresenceView(fd, slots)
            os.close(fd)
        assert views["a"].find(["k"]) == [True] and views["b"].find(["k"]) == [False]
        presence.removed("a", "k")
        assert views["a"].find(["k"]) == [False]
    finally:
        presence.close()


def test_a_table_is_sized_for_the_card() -> None:
    assert slots_for(0) == SLOTS_MIN
    assert slots_for(2**40) == 2**24 == SLOTS_MAX  # 1 TiB: half full with 128 KiB objects
    assert slots_for(2**34) == 2**18


def test_a_table_lasts_while_its_tenant_holds_a_key_or_a_session_maps_it() -> None:
    """Tables are bounded by what the card holds and the sessions open: one that holds no key
    goes when its last session ends, and one whose last key goes while no session maps it goes
    then; a session still mapping a table keeps it (a new one would not be the one it reads)."""
    presence = Presence()
    try:
        fd, _ = presence.share("idle")
        os.close(fd)
        presence.added("busy", "k")
        assert presence.tenants() == ["busy", "idle"]
        presence.release("idle")
        assert presence.tenants() == ["busy"]
        presence.removed("busy", "k")
        assert presence.tenants() == []

        fd, slots = presence.share("t")
        view = PresenceView(fd, slots)
        os.close(fd)
        presence.added("t", "k")
        presence.removed("t", "k")
        presence.added("t", "k2")  # while the session maps it, the same table takes new keys
        assert view.find(["k", "k2"]) == [False, True]
        presence.release("t")
        assert presence.tenants() == ["t"]  # it holds k2
    finally:
        presence.close()


@pytest.mark.parametrize("count", [0, 1, 300, 700])
def test_a_recovery_places_its_keys_as_adding_each_would(count: int) -> None:
    """``load`` (a recovery's keys at once) answers exactly as adding them one by one: runs
    that wrap around the end included (the densest table here holds 700 keys in 1,024 cells),
    and so it does after removals."""
    keys = [f"r{i}" for i in range(count)]
    if count:  # and a run that starts in the last cell, so it wraps around
        keys += keys_at_home(6, SLOTS_MIN, SLOTS_MIN - 1)
    loaded, added = PresenceTable(SLOTS_MIN), PresenceTable(SLOTS_MIN)
    try:
        loaded.load(keys)
        for key in keys:
            added.add(key)
        probe = [*keys, *(f"absent{i}" for i in range(200))]

        def answers(table: PresenceTable) -> list[list[bool] | None]:
            view = view_of(table)
            return [view.find([key]) for key in probe]

        assert answers(loaded) == answers(added)
        assert sum(answer == [True] for answer in answers(loaded)) >= len(keys) - 2
        for key in keys[::3]:
            loaded.remove(key)
            added.remove(key)
        assert answers(loaded) == answers(added)
    finally:
        loaded.close()
        added.close()


def test_a_recovery_into_a_crowded_table_leaves_keys_out_as_adding_does() -> None:
    run = keys_at_home(PROBES_MAX + 3, SLOTS_MIN, 9)
    table = PresenceTable(SLOTS_MIN)
    try:
        table.load(run)
        view = view_of(table)
        assert not view.complete and table.left_out == 3
        assert sum(view.find([key]) == [True] for key in run) == PROBES_MAX
    finally:
        table.close()
