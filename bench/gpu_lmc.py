"""The ``lmcache`` command, loading the c10 shim first when ``LMC_C10_SHIM`` names it.

lmcache 0.5.6's ``cuda_ops`` needs ``c10::NotImplementedError``'s constructor, which torch 2.11
(the GPU device's) does not export; without the shim the server silently falls back to plain
torch copies. The shim (libc10_nie_shim.so, one symbol) comes with the GPU host's device
tooling, which is not part of this repository. bench/h200.sh runs the server through this.
"""

import ctypes
import os
import sys

if os.environ.get("LMC_C10_SHIM"):
    import torch  # noqa: F401  (loads libc10.so, which the shim needs)

    ctypes.CDLL(os.environ["LMC_C10_SHIM"], mode=ctypes.RTLD_GLOBAL)

from lmcache.cli.main import main

sys.exit(main())
