#!/usr/bin/env bash
# Proves a running gateway stores and restores byte-exact: LMCache's own `lmcache bench l2`
# with the shipped adapter JSON (configs/l2-adapter.json) stores 32 objects of 4 MiB through the
# plugin, looks them up and loads them back, comparing every byte. Exit 0 when all match. It
# prints its own lines only, and the bench's output when the bench fails.
#
#   scripts/smoke.sh [--socket PATH]        # the gateway's --socket (default: its default)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SOCKET=""
while [ $# -gt 0 ]; do
  case "$1" in
    --socket) SOCKET=$2; shift 2 ;;
    *) echo "smoke.sh: unknown option $1 (see the header of this script)" >&2; exit 2 ;;
  esac
done
ADP_EXTRAS=${ADP_EXTRAS:-serve} source "$ROOT/scripts/setup-env.sh"
spec=$(python - "$ROOT/configs/l2-adapter.json" "$SOCKET" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
if sys.argv[2]:
    spec["adapter_params"]["socket_path"] = sys.argv[2]
print(json.dumps(spec))
PY
)
out=$(mktemp -d "${TMPDIR:-/tmp}/adp-smoke.XXXXXX")
trap 'rm -rf "$out"' EXIT
# Store, look up and load 32 x 4 MiB; --no-skip-verify compares every byte loaded with what was
# stored, and exits non-zero on any difference. The bench's own output (LMCache's and the
# plugin's log lines, about the bench's process, not the served stack) only when it fails.
lmcache bench l2 --l2-adapter "$spec" --num-keys 32 --data-size-kb 4096 --rounds 1 \
  --warmup-rounds 0 --l1-align-bytes 4096 --lookup-max-hit-rate 1 --no-skip-verify \
  --format json --output "$out/bench.json" -q > "$out/bench.log" 2>&1 \
  || { cat "$out/bench.log" >&2; echo "smoke.sh: lmcache bench l2 failed (its output is above)" >&2; exit 1; }
python - "$out/bench.json" <<'PY'
import json, sys
metrics = json.load(open(sys.argv[1]))["metrics"]
for op in (m for k, m in metrics.items() if k.startswith("op_")):
    if op["total_success"] != op["total_keys"]:
        sys.exit(f"smoke.sh: {op['operation']}: {op['total_success']} of {op['total_keys']} ok")
    print(f"smoke.sh: {op['operation']:6} {op['total_keys']} x 4 MiB ok")
print("smoke.sh: every byte loaded back matches what was stored")
PY
