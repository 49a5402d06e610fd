#!/usr/bin/env bash
# The GPU host's benchmarks in one call, on this checkout (the device gets a copy of the working
# tree): the disk's floor (bench/floor.py with a carried static fio), L1-hit lookups while the same
# server writes through (bench/lookup_under_load.py, GPU mode, 1 GiB prompts), and the 8.6 GB
# long restore (bench/long_restore.py: ours on the default path, ours with L1 in shared memory on
# the copy path and with zero-copy stores, fs_native), ROUNDS rounds, contenders interleaved; and
# on request (STEPS=matrix, MATRIX_ARGS) bench/matrix.py through `lmcache bench l2`, and
# (STEPS=op_path, OP_PATH_ARGS) bench/op_path.py, where a batch's time goes stage by stage, and
# (STEPS=store_start, STORE_START_ARGS) bench/store_start.py, what a store's start costs in
# LMCache's process with the gateway stopped, and (STEPS=gil, GIL_CONTENDER) which threads
# of LMCache's server hold the GIL during one round of lookups under load (py-spy copied into
# .stage; bench/gil_share.py sums its samples), and at memory speed, each after checking that
# /dev/shm has room: (STEPS=restore_tmpfs, RESTORE_TMPFS_ARGS) the long restore with the gateway's
# databases and fs_native on /dev/shm and LMCache alone (--ram-l2 /dev/shm/adp-h200-ram), and
# (STEPS=matrix_tmpfs, MATRIX_TMPFS_ARGS) bench/matrix.py with every contender on /dev/shm and
# LMCache alone (--ram-l2); and (STEPS=trace_replay, TRACE_REPLAY_ARGS) bench/trace_replay.py, a
# production trace through the real stack with its contenders side by side, the GPU hidden (the
# replay's KV is CPU memory), the trace carried as mooncake_conversation_trace.jsonl in the root.
# It replaces the earlier floor_h200.sh and gpu_restore.sh (their results keep their commands).
# Staging, on the CPU host from the repository root (the GPU host's device tooling, not part of
# this repository, has the wheel list and the shim; bench/gpu_lmc.py says why the shim):
#   .whl/   the cp312 wheels of lmcache 0.5.6 and its dependencies, and of lmcache-adp's own
#           (pyproject.toml; no wheel of ours: the checkout is on PYTHONPATH)
#   .stage/ the device tooling's libc10_nie_shim.so and c10_nie_shim.cpp; for STEPS=gil,
#           the static py-spy binary (pip install py-spy, then copy its bin/py-spy)
#   .fio/   bash bench/build_fio.sh
# A dry run on the CPU host: NO_INSTALL=1 MODE=cpu PY=python GB=0.2 LOOKUP_MIB=64 bash bench/h200.sh
# (on a shared host add LMC_BIN=/tmp/lmcbin-$USER OUT=/tmp/out-$USER: the launcher and the results
# go there); the memory-speed steps: STEPS='restore_tmpfs matrix_tmpfs' MATRIX_TMPFS_ARGS='--sizes-kb
# 4096 --keys 8 --in-flight 1 --contenders adp-periodic,fs-odirect --repeats 3 --phase-mib 64
# --floor-gib 0.25' with the same variables.
# One call:
#   run(command="STEPS='floor lookup restore' ROUNDS=1 ADP_COMMIT=$(git rev-parse --short HEAD) \
#       bash bench/h200.sh", carry=[".whl", ".stage", ".fio"], timeout_s=600)
# Each step stops short of BUDGET_S (default 560 s) since the call began, so what ran comes back.
# Results in $OUT, named as bench/results/ names them, after the card that ran them (h200, h100):
# floor-h200.*, lookup-h200.*, matrix-tmpfs-h200.*, long-restore-h200-rN.* and
# long-restore-tmpfs-h200-rN.* (commit one round without -rN), and run_stdout.txt.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/run_stdout.txt") 2>&1
REPO=$PWD; PY=${PY:-python3}; SITE=${SITE:-/tmp/site}; BUDGET_S=${BUDGET_S:-560}
STEPS=${STEPS:-floor lookup restore}; ROUNDS=${ROUNDS:-1}; FIRST_ROUND=${FIRST_ROUND:-1}
export LMCACHE_TRACK_USAGE=false DO_NOT_TRACK=1 PYTHONUNBUFFERED=1 ADP_COMMIT=${ADP_COMMIT:-}
T0=$(date +%s); ts() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }
# room_in_shm GIB WHAT: true when /dev/shm has GIB GiB free, else says why WHAT is skipped
room_in_shm() {
  local free; free=$(df --output=avail -B1G /dev/shm 2>/dev/null | tail -1 | tr -d ' ')
  [ -n "$free" ] && [ "$free" -ge "$1" ] && return 0
  ts "skipping $2: /dev/shm has ${free:-no} GiB free, it needs $1"; return 1
}

ts "== environment, commit ${ADP_COMMIT:-unknown}"
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; $PY -V; nproc; } 2>&1
# the card that ran it names the files (calls for an H200 may land on an H100)
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -oiE 'h[0-9]{3}' | head -1 | tr 'H' 'h')
CARD=${CARD:-gpu}
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
BIN=${LMC_BIN:-/tmp/lmcbin}; mkdir -p $BIN  # `lmcache` that loads the shim (bench/gpu_lmc.py)
printf '#!/bin/sh\nexport PYTHONPATH=%s:"$PYTHONPATH"\nexec %s %s "$@"\n' "$PYTHONPATH" \
  "$($PY -c 'import sys; print(sys.executable)')" "$REPO/bench/gpu_lmc.py" > $BIN/lmcache
chmod +x $BIN/lmcache
# The benches start the gateway as `adp-gateway` beside the interpreter (tests/support's BIN).
PYBIN=$($PY -c 'import sys, os; print(os.path.dirname(sys.executable))')
[ -x "$PYBIN/adp-gateway" ] || { printf '#!/bin/sh\nexport PYTHONPATH=%s:"$PYTHONPATH"\nexec %s -m adp_gateway "$@"\n' \
  "$PYTHONPATH" "$($PY -c 'import sys; print(sys.executable)')" > "$PYBIN/adp-gateway" && chmod +x "$PYBIN/adp-gateway"; }

D=""  # a directory of this run's own, on a real disk that takes O_DIRECT
for d in ${DATA_DIRS:-/tmp /var/tmp /root}; do
  [ "$(stat -f -c %T "$d" 2>/dev/null)" != tmpfs ] || continue
  probe=$(mktemp "$d/.odt.XXXXXX" 2>/dev/null) || continue
  if dd if=/dev/zero of="$probe" bs=1M count=4 oflag=direct status=none 2>/dev/null; then
    rm -f "$probe"; D=$(mktemp -d "$d/adp-h200.XXXXXX"); break
  fi
  rm -f "$probe"
done
[ -z "$D" ] && { echo "no directory takes O_DIRECT"; exit 1; }
mkdir -p "$OUT/logs"; ts "data dir $D: $(df -h "$D" | tail -1)"

own_server() {  # the first `gpu_lmc.py server` among the descendants of pid $1
  local kid found
  for kid in $(pgrep -P "$1"); do
    if tr '\0' ' ' < "/proc/$kid/cmdline" 2>/dev/null | grep -q "gpu_lmc.py server"; then
      echo "$kid"; return
    fi
    found=$(own_server "$kid"); [ -z "$found" ] || { echo "$found"; return; }
  done
}

for step in $STEPS; do
  case $step in
    floor)
      ts "== floor ($(fio --version 2>/dev/null || echo 'no fio'))"
      timeout $(( $(left) - 5 )) $PY -m bench.floor --dir "$D/floor" --file-gib "${FLOOR_GIB:-4}" \
        --sizes-kb "${FLOOR_SIZES_KB:-4096}" --out "$OUT/floor-$CARD"; echo "floor rc=$?"
      rm -rf "$D/floor" ;;
    gil)  # who holds the GIL in LMCache's server while it writes through (py-spy carried in .stage)
      C=${GIL_CONTENDER:-lmcache_adp}; ts "== GIL holders in LMCache's server, $C, lookups under load"
      $PY -m bench.lookup_under_load --dir "$D/gil" --mode "${MODE:-gpu}" --prompt-mib "${LOOKUP_MIB:-1024}" \
        --prompts "${LOOKUP_PROMPTS:-4}" --rounds 1 --contenders "$C" --skip-exists ${LOOKUP_ARGS:-} \
        --lmcache-bin $BIN --out "$OUT/gil-lookup" > "$OUT/gil-lookup.log" 2>&1 &
      BENCH=$!; PID=""  # the server this bench started, never another process of that name
      for _ in $(seq 1200); do PID=$(own_server "$BENCH"); [ -n "$PID" ] && break; sleep 0.1; done
      [ -n "$PID" ] && timeout $(( $(left) - 5 )) .stage/py-spy record --gil --threads --nonblocking -r 500 \
        -f raw -o "$OUT/gil.txt" -p "$PID" > "$OUT/gil-spy.log" 2>&1
      wait $BENCH; echo "gil rc=$?"; $PY bench/gil_share.py "$OUT/gil.txt"
      rm -rf "$D/gil" ;;
    lookup)
      ts "== lookup_under_load, GPU mode, ${LOOKUP_MIB:-1024} MiB prompts"
      # the kernel weighs the gateway and LMCache's server as autogroups when this is 1 (cpu_nice)
      echo "sched_autogroup_enabled=$(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null)"
      timeout $(( $(left) - 5 )) $PY -m bench.lookup_under_load --dir "$D/lookup" --mode "${MODE:-gpu}" \
        --prompt-mib "${LOOKUP_MIB:-1024}" --prompts "${LOOKUP_PROMPTS:-4}" \
        --rounds "${LOOKUP_ROUNDS:-3}" --contenders "${LOOKUP_CONTENDERS:-lmcache_adp,fs_native,null}" \
        ${LOOKUP_ARGS:-} --lmcache-bin $BIN --logs "$OUT/logs/lookup" \
        --out "$OUT/lookup-$CARD"; echo "lookup rc=$?"
      rm -rf "$D/lookup" ;;
    matrix)
      ts "== matrix through lmcache bench l2 (${MATRIX_ARGS:-})"
      ADP_LMCACHE_BIN=$BIN timeout $(( $(left) - 5 )) $PY -m bench.matrix --dir "$D/matrix" \
        ${MATRIX_ARGS:-} --out "$OUT/matrix-$CARD"; echo "matrix rc=$?"
      rm -rf "$D/matrix" ;;
    op_path)
      ts "== op_path: where a batch's time goes (${OP_PATH_ARGS:-})"
      timeout $(( $(left) - 5 )) $PY -m bench.op_path --dir "$D/op" ${OP_PATH_ARGS:-} \
        --out "$OUT/op-path-$CARD"; echo "op_path rc=$?"
      rm -rf "$D/op" ;;
    store_start)  # the plugin's own work at a store's start, gateway stopped (no LMCache)
      ts "== store_start: what a store's start costs in LMCache's process"
      timeout $(( $(left) - 5 )) $PY -m bench.store_start --dir "$D/ss" ${STORE_START_ARGS:-} \
        --out "$OUT/store-start-$CARD"; echo "store_start rc=$?"
      rm -rf "$D/ss" ;;
    matrix_tmpfs)  # every contender's storage on /dev/shm, and LMCache alone (bench/README.md)
      M=/dev/shm/adp-h200-matrix; R=/dev/shm/adp-h200-ram
      room_in_shm "${MATRIX_TMPFS_GIB:-12}" matrix_tmpfs || continue
      A=${MATRIX_TMPFS_ARGS:---sizes-kb 4096,32768 --keys 32 --in-flight 1,4 --contenders adp-periodic,fs-odirect --repeats 3 --phase-mib 512 --floor-gib 1}
      ts "== matrix on tmpfs through lmcache bench l2 ($A)"
      ADP_LMCACHE_BIN=$BIN timeout $(( $(left) - 5 )) $PY -m bench.matrix --dir "$M" --ram-l2 "$R" \
        $A --out "$OUT/matrix-tmpfs-$CARD"; echo "matrix_tmpfs rc=$?"
      rm -rf "$M" "$R" ;;
    restore_tmpfs)  # the gateway's databases, fs_native and LMCache alone on /dev/shm
      T=/dev/shm/adp-h200-restore; R=/dev/shm/adp-h200-ram  # LMCache alone's files: in R
      NEED=$(awk -v g="${GB:-8.6}" 'BEGIN { print int(g * 1.8 + 3) }')  # the databases, with headroom
      room_in_shm "${RESTORE_TMPFS_GIB:-$NEED}" restore_tmpfs || continue
      for r in $(seq "$FIRST_ROUND" $(( FIRST_ROUND + ROUNDS - 1 ))); do
        [ "$(left)" -lt "${ROUND_S:-200}" ] && { ts "no time left for tmpfs round $r"; break; }
        ts "== long_restore on tmpfs, round $r, ${GB:-8.6} GB (${RESTORE_TMPFS_ARGS:-})"
        timeout $(( $(left) - 5 )) $PY -m bench.long_restore --dir "$T" --ram-l2 "$R" \
          --gb "${GB:-8.6}" --mode "${MODE:-gpu}" --lmcache-bin $BIN ${RESTORE_TMPFS_ARGS:-} \
          --out "$OUT/long-restore-tmpfs-$CARD-r$r" --logs "$OUT/logs/restore-tmpfs-r$r"
        echo "long_restore_tmpfs round $r rc=$?"; rm -rf "$T" "$R"
      done ;;
    trace_replay)  # issue 44: hits and drive writes per capacity, one process per run
      A=${TRACE_REPLAY_ARGS:---speed 8 --capacities 1,2,10,50 --contenders ours,gateway-lru,lmcache-lru,fs_native --jobs 13}
      ts "== trace_replay ($A)"
      CUDA_VISIBLE_DEVICES= ADP_LMCACHE_BIN=$BIN timeout $(( $(left) - 5 )) $PY -m bench.trace_replay \
        "${TRACE:-mooncake_conversation_trace.jsonl}" $A --out "$OUT/trace-replay-$CARD"; echo "trace_replay rc=$?" ;;
    restore)
      for r in $(seq "$FIRST_ROUND" $(( FIRST_ROUND + ROUNDS - 1 ))); do
        [ "$(left)" -lt "${ROUND_S:-200}" ] && { ts "no time left for round $r"; break; }
        ts "== long_restore round $r, ${GB:-8.6} GB"
        timeout $(( $(left) - 5 )) $PY -m bench.long_restore --dir "$D/restore" --gb "${GB:-8.6}" \
          --mode "${MODE:-gpu}" --lmcache-bin $BIN --out "$OUT/long-restore-$CARD-r$r" \
          --logs "$OUT/logs/restore-r$r" ${RESTORE_ARGS:---shm-name adp-h200-l1}
        echo "long_restore round $r rc=$?"; rm -rf "$D/restore"
      done ;;
  esac
done
tar -czf "$OUT/logs.tgz" -C "$OUT" logs 2>/dev/null && rm -rf "$OUT/logs"
rm -rf "$D"; ts "== done"
