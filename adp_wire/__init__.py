"""The contract both sides of the ring share."""
