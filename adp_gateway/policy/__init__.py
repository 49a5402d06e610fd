"""What the gateway keeps and what it lets go: admission of stores (admission.py, over a record
of recent sightings and a write budget) and the choice of a region to evict (victims.py). Pure
decisions, no I/O: the gateway and ``bench/trace_sim.py`` run the same code."""
