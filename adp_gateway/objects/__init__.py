"""Objects over a card: what the gateway stores through (store.py). An object of a tenant is
stored as fragments, each a value of the card (card/base.py) in the tenant's namespace, named
after the object (names.py); the catalog (catalog.py) holds each object's current version."""
