"""Storage below the store: the software card (RegionLog) over devices (files, block devices,
memory for tests)."""
