"""The plugin's logger, and a handler that makes its lines show up in ``lmcache server``'s output.

LMCache logs through handlers of its own and leaves the root logger bare, so lines of ours that
only propagated would be dropped below WARNING, and printed without time or origin above it.
The fallback handler writes to stderr in LMCache's style only while the root logger has no
handler; a host that configures logging (a test runner, an application) gets them once, its way.
"""

from __future__ import annotations

import logging
import sys


class _FallbackHandler(logging.StreamHandler):  # type: ignore[type-arg]
    def emit(self, record: logging.LogRecord) -> None:
        if not logging.getLogger().handlers:
            super().emit(record)


log = logging.getLogger("lmcache_adp")
if not any(isinstance(h, _FallbackHandler) for h in log.handlers):
    _handler = _FallbackHandler(sys.stderr)
    _handler.setFormatter(logging.Formatter("[%(asctime)s] lmcache-adp %(levelname)s: %(message)s"))
    log.addHandler(_handler)
if log.level == logging.NOTSET:
    log.setLevel(logging.INFO)
