"""Shared-memory rings between one plugin instance and the gateway: the layout of a session's
memory (``layout``) and the queues over it (``queue``)."""
