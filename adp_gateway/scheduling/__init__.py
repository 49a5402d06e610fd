"""Which task an I/O thread runs next (the scheduler, the write depth), and the tasks: a
session's stores, deletes and groups of loads; the periodic sync."""
