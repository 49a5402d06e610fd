"""The software card: a log-structured region store over files or block devices, split by
concern (see docs/design.md, "The card seam")."""
