"""The lmcache-adp storage gateway: one process per host persisting KV chunks on the ADP card.

Layers, imported one way only (tests/unit/test_layering.py checks it)::

    __main__ -> service -> session -> scheduler, objects.store (objects as fragments)
                                        \\-> card.base (the Card seam: named values)
                                        \\-> card.loader -> card.memory, card.software
    adp_wire (protocol, ring, fragmenter: the contract, also imported by the plugin)
"""
