#!/usr/bin/env bash
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
REPO=$PWD; PY=${PY:-python3}; SITE=${SITE:-/tmp/site}; BUDGET_S=${BUDGET_S:-560}
STEPS=${STEPS:-floor lookup restore}; ROUNDS=${ROUNDS:-1}; FIRST_ROUND=${FIRST_ROUND:-1}
export LMCACHE_TRACK_USAGE=false DO_NOT_TRACK=1 PYTHONUNBUFFERED=1 ADP_COMMIT=${ADP_COMMIT:-}
T0=$(date +%s); ts() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }

ts "== environment, commit ${ADP_COMMIT:-unknown}"
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; $PY -V; nproc; } 2>&1
[ -n "${NO_INSTALL:-}" ] || [ -d "$SITE/lmcache" ] || $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --target "$SITE" .whl/*.whl || { echo PIP_FAIL; exit 1; }
export PYTHONPATH=$REPO:$SITE
[ -x .fio/fio ] && export PATH=$REPO/.fio:$PATH
SHIM=$REPO/.stage/libc10_nie_shim.so
if [ "${MODE:-gpu}" = gpu ] && ! LMC_C10_SHIM=$SHIM $PY -c "import torch, ctypes, os; ctypes.CDLL(os.environ['LMC_C10_SHIM'], mode=ctypes.RTLD_GLOBAL); import lmcache.cuda_ops" 2>/dev/null; then
  TI=$($PY -c "import torch,os;print(os.path.join(os.path.dirname(torch.__file__),'include'))")
  g++ -shared -fPIC -O2 -std=c++17 -D_GLIBCXX_USE_CXX11_ABI=1 -I"$TI" .stage/c10_nie_shim.cpp \
    -L"$(dirname "$TI")/lib" -lc10 -o /tmp/libc10_nie_shim.so && SHIM=/tmp/libc10_nie_shim.so
fi
[ "${MODE:-gpu}" = gpu ] && export LMC_C10_SHIM=$SHIM
BIN=/tmp/lmcbin; mkdir -p $BIN  # `lmcache` that loads the shim (bench/gpu_lmc.py)
printf '#!/bin/sh\nexport PYTHONPATH=%s:"$PYTHONPATH"\nexec %s %s "$@"\n' "$PYTHONPATH" \
  "$($PY -c 'import sys; print(sys.executable)')" "$REPO/bench/gpu_lmc.py" > $BIN/lmcache
chmod +x $BIN/lmcache
# The benches start the gateway as `adp-gateway` beside the interpreter (tests/support's BIN).
PYBIN=$($PY -c 'import sys, os; print(os.path.dirname(sys.executable))')
[ -x "$PYBIN/adp-gateway" ] || { printf '#!/bin/sh\nexport PYTHONPATH=%s:"$PYTHONPATH"\nexec %s -m adp_gateway "$@"\n' \
  "$PYTHONPATH" "$($PY -c 'import sys; print(sys.executable)')" > "$PYBIN/adp-gateway" && chmod +x "$PYBIN/adp-gateway"; }

D=""  # a directory on a real disk that takes O_DIRECT
for d in ${DATA_DIRS:-/tmp /var/tmp /root}; do
  if [ "$(stat -f -c %T "$d" 2>/dev/null)" != tmpfs ] &&
    dd if=/dev/zero of="$d/.odt" bs=1M count=4 oflag=direct status=none 2>/dev/null; then
    D=$d/adp-h200; rm -f "$d/.odt"; break
  fi
  rm -f "$d/.odt"
done
[ -z "$D" ] && { echo "no directory takes O_DIRECT"; exit 1; }
mkdir -p "$D"
for i in 1 2 3; do
  for v in base gwsi; do
    [ "$(left)" -lt 40 ] && break 2
    mkdir -p "$OUT/$v-$i"; export ADP_TRACE_DIR=$OUT/$v-$i
    case $v in base) E="";; gwsi) E="ADP_SI=0.0005";; esac
    ts "== $v $i"
    env $E timeout $(( $(left) - 5 )) $PY -m bench.lookup_under_load --dir "$D/lookup" --mode gpu \
      --prompt-mib 1024 --prompts 8 --rounds 1 --contenders lmcache_adp --skip-exists \
      --lmcache-bin $BIN --out "$OUT/$v-$i/tr" 2>&1 | grep "^lmcache_adp 0" | cut -c1-200
    rm -rf "$D/lookup"
  done
done
rm -rf "$D"
$PY - "$OUT" <<'PYEOF'
import glob, os, sys
out = sys.argv[1]
def s(xs):
    xs = sorted(xs)
    return f"p50 {xs[len(xs)//2]:.2f} p90 {xs[int(len(xs)*0.9)]:.2f} max {xs[-1]:.2f}"
for d in sorted(glob.glob(f"{out}/*-*/")):
    for f in glob.glob(d + "trace-*.txt"):
        rows = [list(map(float, l.split())) for l in open(f)]
        for name, r in (("idle", rows[:40]), ("busy", rows[40:])):
            if r:
                print(os.path.basename(d.rstrip("/")), name, len(r), "rt:", s([x[1] for x in r]), "| react:", s([x[2] for x in r]))
PYEOF
tar -czf "$OUT/traces.tgz" -C "$OUT" $(cd "$OUT" && ls -d */) && rm -rf "$OUT"/*-*/
ts "== done"
