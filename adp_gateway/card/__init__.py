"""The card seam: the key-value surface the object store (adp_gateway/objects/) stores the
fragments of objects through (base.py), its implementations (software/, memory.py) and the
loader that picks one from the config."""
