#!/usr/bin/env bash
# Scratch (not committed): py-spy on the lmcache server of ours during lookup_under_load, GIL holders only.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
(
  for i in $(seq 1 900); do
    pid=$(pgrep -f "gpu_lmc.py server" | head -1)
    [ -n "$pid" ] && break
    sleep 0.2
  done
  echo "profiling pid $pid"
  ./.stage/py-spy record --pid "$pid" --gil --threads -r 1000 -d 200 -f speedscope -o "$OUT/gil.speedscope.json" --nonblocking > "$OUT/pyspy.log" 2>&1
  echo "py-spy rc=$?" >> "$OUT/pyspy.log"
) &
STEPS=lookup LOOKUP_PROMPTS=8 LOOKUP_ROUNDS=1 LOOKUP_CONTENDERS=lmcache_adp LOOKUP_ARGS=--skip-exists BUDGET_S=300 bash bench/h200.sh
wait
