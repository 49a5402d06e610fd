#!/usr/bin/env bash
# The lookup tail on the GPU host with the session windows in 4 KiB pages (the host's shmem
# setting `never`) and in huge pages (`advise`, what `scripts/serve.sh --huge-pages` sets), one
# round of bench/h200.sh's lookup step each in turn, PAIRS times within TOTAL_S; the setting is
# put back as found.
set -u
OUT=${OUT:-/tmp/out}; T0=$(date +%s); mkdir -p "$OUT"
SETTING=/sys/kernel/mm/transparent_hugepage/shmem_enabled
FOUND=$(sed 's/.*\[\(.*\)\].*/\1/' $SETTING); echo "shmem_enabled found: $FOUND" | tee "$OUT/host.txt"
for i in $(seq "${PAIRS:-3}"); do
  for mode in never advise; do
    left=$(( ${TOTAL_S:-570} - ($(date +%s) - T0) ))
    [ "$left" -lt "${ROUND_S:-90}" ] && { echo "no time left for $mode-$i"; break 2; }
    echo $mode > $SETTING
    OUT=$OUT/$mode-$i BUDGET_S=$((left - 5)) STEPS=lookup LOOKUP_ROUNDS=1 LOOKUP_PROMPTS=${LOOKUP_PROMPTS:-8} \
      LOOKUP_CONTENDERS=${CONTENDERS:-lmcache_adp,null} ADP_COMMIT=${ADP_COMMIT:-} \
      LOOKUP_ARGS="--skip-exists --lookups-per-store ${PER_STORE:-16} --idle-lookups ${IDLE:-120}" bash bench/h200.sh > /dev/null 2>&1
    grep -h "^| " "$OUT/$mode-$i/lookup_under_load-h200.md" 2>/dev/null | grep -v "contender\|---" | sed "s/^/$mode-$i /"
  done
done
echo "$FOUND" > $SETTING; echo "shmem_enabled restored: $(cat $SETTING)"
echo "[$(( $(date +%s) - T0 ))s] done"
