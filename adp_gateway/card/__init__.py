"""The card seam: the key-value surface the gateway stores fragments through (base.py), its
implementations (software/, memory.py) and the loader that picks one from the config."""
