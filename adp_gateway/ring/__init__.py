"""Shared-memory rings between one plugin instance and the gateway (the only gateway code the
plugin imports, with adp_gateway.protocol)."""
