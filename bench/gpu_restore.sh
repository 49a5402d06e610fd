#!/usr/bin/env bash
# The long-prompt restore on the GPU device: bench/long_restore.py in --mode gpu (KV cache in GPU
# memory, registered with the server over CUDA IPC) with our gateway + plugin and fs_native below
# a real `lmcache server`, plus the disk's floor (the Python O_DIRECT probe and dd).
# Staging, on the CPU host from the repository root (../shared/device/README.md):
#   pip download the cp312 wheels of lmcache 0.5.6 and its deps, msgpack and xxhash into .whl/;
#   cp -r ../shared/device .stage                  # libc10_nie_shim.so + c10_nie_shim.cpp
#   mkdir .stage/src && git archive HEAD | tar -x -C .stage/src && cp bench/long_restore*.py \
#     bench/gpu_* .stage/src/bench/                # a snapshot: nobody's uncommitted changes
#   pip wheel --no-deps -w .whl .stage/src         # our project, as the device installs it
# Then one call:
#   run(command='SRC=.stage/src ADP_COMMIT=<sha> EXTRA="--shm-name adp-gpu-l1" bash bench/gpu_restore.sh',
#       carry=[".whl", ".stage"], timeout_s=540)
# EXTRA: more bench.long_restore flags (--shm-name adds lmcache-adp with L1 in shared memory,
# the plugin's zero-copy path). Results: $OUT/gpu_restore.{json,md}, run_stdout.txt, logs.tgz.
# Local dry run (CPU host, .venv):
#   NO_INSTALL=1 PY=$PWD/.venv/bin/python MODE=cpu GB=0.1 DATA_DIRS=/tmp bash bench/gpu_restore.sh
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/run_stdout.txt") 2>&1
REPO=$PWD; SRC=$(cd "${SRC:-$REPO}" && pwd); PY=${PY:-python3}; MODE=${MODE:-gpu}; GB=${GB:-8.6}
SHIM=${SHIM:-$REPO/.stage/libc10_nie_shim.so}; SITE=${SITE:-/tmp/site}
export LMCACHE_TRACK_USAGE=false DO_NOT_TRACK=1 PYTHONUNBUFFERED=1
T0=$(date +%s); ts() { echo "[$(( $(date +%s) - T0 ))s] $*"; }

ts "== environment"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; $PY -V; nproc; free -g | head -2; } 2>&1
if [ -z "${NO_INSTALL:-}" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl || { echo PIP_FAIL; exit 1; }
  export PYTHONPATH=$SITE
fi
$PY -c "import lmcache, torch, msgpack, xxhash; print('import OK: torch', torch.__version__, 'cuda', torch.cuda.is_available())" 2>&1 | grep -v INFO
if [ "$MODE" = gpu ]; then
  if ! LMC_C10_SHIM=$SHIM $PY -c "import torch, ctypes, os; ctypes.CDLL(os.environ['LMC_C10_SHIM'], mode=ctypes.RTLD_GLOBAL); import lmcache.cuda_ops" 2>/dev/null; then
    TI=$($PY -c "import torch,os;print(os.path.join(os.path.dirname(torch.__file__),'include'))")
    g++ -shared -fPIC -O2 -std=c++17 -D_GLIBCXX_USE_CXX11_ABI=1 -I"$TI" "$REPO/.stage/c10_nie_shim.cpp" \
      -L"$(dirname "$TI")/lib" -lc10 -o /tmp/libc10_nie_shim.so && SHIM=/tmp/libc10_nie_shim.so && echo "rebuilt the shim"
  fi
  export LMC_C10_SHIM=$SHIM
  LMC_C10_SHIM=$SHIM $PY -c "import torch, ctypes, os; ctypes.CDLL(os.environ['LMC_C10_SHIM'], mode=ctypes.RTLD_GLOBAL); import lmcache.cuda_ops; print('cuda_ops OK with the shim')" 2>&1 | tail -1
fi

# `lmcache` for tests.support.LMCacheServer (which sets PYTHONPATH to the source tree).
BIN=/tmp/lmcbin; mkdir -p $BIN
printf '#!/bin/sh\nexport PYTHONPATH=%s:"$PYTHONPATH"\nexec %s %s "$@"\n' "${PYTHONPATH:-}" "$($PY -c 'import sys; print(sys.executable)')" "$SRC/bench/gpu_lmc.py" > $BIN/lmcache
chmod +x $BIN/lmcache

D=""  # a directory on a real disk that takes O_DIRECT
for d in ${DATA_DIRS:-/tmp /var/tmp /root}; do
  if [ "$(stat -f -c %T "$d" 2>/dev/null)" != tmpfs ] && dd if=/dev/zero of="$d/.odt" bs=1M count=4 oflag=direct status=none 2>/dev/null; then
    D=$d/adp-gpu-restore; rm -f "$d/.odt"; break; fi
  rm -f "$d/.odt"
done
[ -z "$D" ] && { echo "no O_DIRECT directory"; exit 1; }
rm -rf "$D" /tmp/gpu-restore-logs; mkdir -p "$D"; ts "data dir $D: $(df -h "$D" | tail -1)"

ts "== dd O_DIRECT floor, ${GB} GB, bs=32M"
N=$($PY -c "print(max(1, round($GB * 1e9 / 2**25)))")
dd if=/dev/zero of="$D/dd.bin" bs=32M count="$N" oflag=direct 2>&1 | tail -1
dd if="$D/dd.bin" of=/dev/null bs=32M iflag=direct 2>&1 | tail -1 | tee "$OUT/dd_read.txt"
rm -f "$D/dd.bin"

ts "== bench.long_restore --mode $MODE --gb $GB"
(cd "$SRC" && $PY -m bench.long_restore --dir "$D/run" --gb "$GB" --mode "$MODE" --lmcache-bin $BIN \
  --out "$OUT/gpu_restore" --logs /tmp/gpu-restore-logs ${EXTRA:-}); echo "long_restore rc=$?"
tar -czf "$OUT/logs.tgz" -C /tmp gpu-restore-logs 2>/dev/null
rm -rf "$D"
ts "== done"
