"""Goal: fragments cover an object exactly, respect the size bound and stripe over databases."""

from __future__ import annotations

import itertools

from adp_wire.fragmenter import plan


def test_fragments_tile_the_object_for_many_shapes() -> None:
    for size, limit, dbs, key_hash in itertools.product(
        [0, 1, 4095, 4096, 4097, 10**6, 32 * 2**20], [4096, 2**20, 4 * 2**20], [1, 2, 3], [0, 7]
    ):
        fragments = plan(size, limit, dbs, key_hash)
        assert fragments[0].offset == 0
        assert sum(f.length for f in fragments) == size
        assert all(0 < f.length <= limit for f in fragments) or size == 0
        for a, b in itertools.pairwise(fragments):
            assert b.offset == a.offset + a.length and a.length == limit
        assert [f.number for f in fragments] == list(range(len(fragments)))
        assert [f.database for f in fragments] == [
            (key_hash + i) % dbs for i in range(len(fragments))
        ]


def test_large_objects_use_every_database() -> None:
    fragments = plan(32 * 2**20, 4 * 2**20, 2, key_hash=5)
    assert [f.database for f in fragments] == [1, 0, 1, 0, 1, 0, 1, 0]
