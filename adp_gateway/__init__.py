"""The lmcache-adp storage gateway: one process per host persisting KV chunks on the ADP card.

Layers, imported one way only (tests/unit/test_layering.py checks it)::

    __main__ -> service -> session -> scheduler -> store -> fragmenter, index, format -> backends
                       \\-> protocol, ring (also imported by the plugin, lmcache_adp)
"""
