"""Goal: a doorbell's loads go to the I/O threads in groups that keep their order, hold at most
GROUP_LOADS_MAX loads and GROUP_BYTES_MAX bytes, and leave a large load alone (so several I/O
threads read large objects in parallel); a small doorbell still spreads over SPREAD_GROUPS groups
of at least SPREAD_BYTES_MIN; and the loads of a group share a deadline, so none expires with
another batch's."""

from __future__ import annotations

import dataclasses

from adp_gateway.scheduling.loads import (
    GROUP_BYTES_MAX,
    GROUP_LOADS_MAX,
    SPREAD_BYTES_MIN,
    SPREAD_GROUPS,
    Load,
    groups,
)
from adp_wire.protocol import Op
from adp_wire.ring.layout import Submission


def loads(*sizes: int) -> list[Load]:
    extent = memoryview(bytearray(1))
    return [
        Load(Submission(n, Op.GET, 0, 0, n, 0, 0, 0, 0, size), f"k{n}", extent, size)
        for n, size in enumerate(sizes)
    ]


def sizes_of(wanted: list[Load]) -> list[list[int]]:
    return [[load.object_bytes for load in group] for group in groups(wanted)]


def test_small_loads_share_a_group_up_to_its_count_or_bytes_and_keep_their_order() -> None:
    tiny = loads(*[4096] * (GROUP_LOADS_MAX + 6))
    assert [len(group) for group in groups(tiny)] == [GROUP_LOADS_MAX, 6]
    chunks = loads(*[256 * 2**10] * 67)  # LMCache's default chunk: 8 to a group of 2 MiB
    found = list(groups(chunks))
    assert [len(group) for group in found] == [8] * 8 + [3]
    assert [load for group in found for load in group] == chunks


def test_large_loads_go_alone_and_a_group_never_passes_its_bytes() -> None:
    big, small = GROUP_BYTES_MAX, GROUP_BYTES_MAX // 8
    assert sizes_of(loads(big, big)) == [[big], [big]]
    assert sizes_of(loads(small, big, small)) == [[small], [big], [small]]
    assert sizes_of(loads(*[small] * 33)) == [[small] * 8] * 4 + [[small]]
    assert sizes_of([]) == []


def test_a_small_doorbell_spreads_over_several_groups_but_none_below_its_least_bytes() -> None:
    chunk = 256 * 2**10  # a batch of eight chunks: four groups of two
    assert sizes_of(loads(*[chunk] * 8)) == [[chunk] * 2] * SPREAD_GROUPS
    assert sizes_of(loads(*[chunk] * 9)) == [[chunk] * 2] * 4 + [[chunk]]  # at most 576 KiB each
    small = SPREAD_BYTES_MIN // 4  # four of them fill one group's least bytes: one group
    assert sizes_of(loads(*[small] * 4)) == [[small] * 4]
    assert sizes_of(loads(*[small] * 5)) == [[small] * 4, [small]]


def test_loads_of_batches_with_other_deadlines_never_share_a_group() -> None:
    """One doorbell may carry two batches (one that waited for room, one fresh): a group runs
    by its earliest deadline, so the fresh batch's loads would expire with the old one's."""
    mixed = [
        dataclasses.replace(load, submission=load.submission._replace(deadline_ns=deadline))
        for load, deadline in zip(loads(*[4096] * 6), [5, 5, 9, 9, 9, 5], strict=True)
    ]
    assert [[load.submission.deadline_ns for load in group] for group in groups(mixed)] == [
        [5, 5],
        [9, 9, 9],
        [5],
    ]
