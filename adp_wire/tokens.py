"""A tenant's token file: one line holding a secret, readable by its owner (and group) only.

The gateway reads the tenant's copy (``tenants: [{token_file: ...}]``), the plugin its own
(``adapter_params.token_file``), and the plugin sends the secret in its ``Hello``
(adp_wire/protocol.py), which the gateway compares in constant time.
"""

from __future__ import annotations

import os
import stat

from adp_wire.errors import ConfigError


def read_token(path: str) -> str:
    """A token file's secret, refusing a file every user can read or an empty one."""
    try:
        mode = os.stat(path).st_mode
        with open(path) as f:
            token = f.read().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read token file {path}: {exc.strerror}") from exc
    if mode & stat.S_IROTH:
        raise ConfigError(f"token file {path} is readable by every user: chmod o-r {path}")
    if not token:
        raise ConfigError(f"token file {path} is empty: write a secret in it")
    return token
