#!/bin/bash
source .venv/bin/activate
export LMCACHE_TRACK_USAGE=false DO_NOT_TRACK=1
for r in 1 2; do
  for v in A B; do
    cd /tmp/wt$v && PYTHONPATH=/tmp/wt$v python -m bench.matrix --dir /tmp/ab$v --sizes-kb 256 --keys 8,32 \
      --in-flight 1 --contenders adp-periodic,fs-odirect --repeats 3 --floor-gib 0.25 \
      --out /tmp/ab-results/$v-r$r > /tmp/ab-results/$v-r$r.log 2>&1
    echo "$v r$r rc=$? $(date +%T)"
  done
done
