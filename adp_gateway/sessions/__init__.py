"""One connected plugin: its rings, the client's memory the gateway reads (its L1 segment, its
process), the presence tables it answers lookups from, and what it did."""
