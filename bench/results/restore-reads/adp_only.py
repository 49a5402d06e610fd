"""One contender of bench/long_restore.py alone (no floor, no other contender), CPU mode:

    python bench/results/restore-reads/adp_only.py GB adp|fs [GATEWAY_CONFIG]

Prints the restore's JSON (``lookup_prefetch_s``, ``retrieve_s``, ``restore_s``). Works in /tmp/lro.
"""

import json
import shutil
import sys
from pathlib import Path

from bench.long_restore import Prompt, Setup, run_adp, run_fs_native
from tests.support import BIN

gigabytes, contender = float(sys.argv[1]), sys.argv[2]
config = Path(sys.argv[3]) if len(sys.argv) > 3 else None
workdir = Path("/tmp/lro")
shutil.rmtree(workdir, ignore_errors=True)
workdir.mkdir()
setup = Setup(workdir, Prompt.of_size(gigabytes), "cpu", BIN, None)
result = run_adp(setup, config=config) if contender == "adp" else run_fs_native(setup)
print(json.dumps(result["restore"]))
