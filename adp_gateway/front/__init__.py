"""The front door: the gateway's Unix socket, who may connect as which tenant, and each
connection's handshake (slots per peer, refusals)."""
