"""What an operator sees: metrics and probes, `adp-gateway status`, `adp-gateway verify`."""
