import sys, json
from pathlib import Path
from bench.long_restore import Setup, Prompt, run_adp, run_fs_native
from tests.support import BIN
gb = float(sys.argv[1]); which = sys.argv[2]
d = Path("/tmp/lro"); import shutil; shutil.rmtree(d, ignore_errors=True); d.mkdir()
setup = Setup(d, Prompt.of_size(gb), "cpu", BIN, None)
r = run_adp(setup, config=Path(sys.argv[3]) if len(sys.argv) > 3 else None) if which == "adp" else run_fs_native(setup)
print(json.dumps(r["restore"]))
