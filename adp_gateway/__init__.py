"""The lmcache-adp storage gateway: one process per host persisting KV chunks on the ADP card.

Layers, imported one way only (tests/unit/test_layering.py checks it)::

    __main__ -> service -> session -> scheduler, card.base (the Card seam)
                       \\-> card.loader -> card.memory, card.software (index, region log, devices)
                       \\-> protocol, ring (also imported by the plugin, lmcache_adp)
"""
