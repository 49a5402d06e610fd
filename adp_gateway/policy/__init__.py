"""What the gateway writes: admission of stores (admission.py), over a record of recent
sightings (sightings.py) and a write budget (budget.py). Pure decisions, no I/O: the gateway and
``bench/trace_sim.py`` run the same code. Which region the software card evicts is the card's
own choice (adp_gateway/card/software/victims.py)."""
