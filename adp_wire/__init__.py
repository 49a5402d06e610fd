"""The contract between the plugin (lmcache_adp) and the gateway (adp_gateway).

Both sides import this package and nothing of each other (tests/unit/test_layering.py), so what
one side writes and the other reads is defined once, here. docs/ring-format.md describes it.

- ``protocol``: the handshake frames, op codes, statuses, request payloads, the socket default
- ``ring.layout``: one session's shared memory: header, queue entries, arenas, window
- ``ring.queue``: the single-producer single-consumer queues over it, and ``check_host``
- ``ring.doorbell``: the eventfds by which each side wakes the other
- ``tokens``: the tenant token file both sides read
- ``errors``: the exception tree both sides raise
- ``checksum``: the one checksum of records on disk, which tools and tests recompute
- ``fragmenter``: how an object splits into fragments (the plan, no I/O)
- ``units``: byte sizes such as ``64GiB``, parsed and printed

``python -m adp_wire socket-path`` prints the default socket path, and ``python -m adp_wire
versions`` the protocol and ring layout versions, for scripts.
"""
