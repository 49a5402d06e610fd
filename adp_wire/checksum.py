"""The one checksum of the project: xxh3_64 (about 20 GB/s, and it releases the GIL).

It guards record headers and payloads on disk (adp_gateway/format.py), and zero-copy ops exchange
payload checksums through the ring, so the plugin computes the very same function.
"""

from __future__ import annotations

import xxhash


def checksum(data: bytes | memoryview, seed: int = 0) -> int:
    return int(xxhash.xxh3_64_intdigest(data, seed))
