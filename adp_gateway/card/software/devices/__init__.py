"""The devices below the software card: files or block devices, memory for tests, a fault
injecting wrapper, group commit and the background preparer."""
